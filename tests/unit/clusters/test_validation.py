"""What an operator types about a cluster: dashboard URL, network policy, labels."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps.clusters.validation import (
    MAX_LABELS,
    check_network_policy,
    labels_text,
    normalize_dashboard_url,
    parse_labels_text,
    validate_labels,
)


def message_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> str:
    (message,) = excinfo.value.messages
    return message


# --- normalize_dashboard_url -----------------------------------------------------------------


def test_a_trailing_slash_is_stripped():
    assert normalize_dashboard_url("http://ray-head.example:8265/") == "http://ray-head.example:8265"


def test_surrounding_whitespace_is_stripped():
    assert normalize_dashboard_url("  https://ray-head.example:8265  ") == "https://ray-head.example:8265"


def test_scheme_and_host_are_lowercased():
    assert normalize_dashboard_url("HTTP://Ray-Head.Example:8265") == "http://ray-head.example:8265"


def test_a_path_prefix_is_kept_without_its_trailing_slash():
    assert normalize_dashboard_url("https://proxy.example/ray/dashboard/") == "https://proxy.example/ray/dashboard"


def test_a_url_without_port_stays_without_port():
    assert normalize_dashboard_url("https://ray.example") == "https://ray.example"


def test_an_ipv6_literal_stays_bracketed():
    assert normalize_dashboard_url("http://[::1]:8265/") == "http://[::1]:8265"


def test_an_ipv6_literal_without_port_stays_bracketed():
    assert normalize_dashboard_url("http://[2001:db8::5]") == "http://[2001:db8::5]"


def test_an_empty_url_asks_for_one():
    with pytest.raises(ValidationError) as caught:
        normalize_dashboard_url("   ")
    assert message_of(caught).startswith("Enter the Ray dashboard URL")


@pytest.mark.parametrize(
    "url", ["ftp://ray-head:8265", "ray-head.example:8265", "file:///etc/passwd", "//ray-head:8265"]
)
def test_a_url_that_is_not_http_or_https_is_refused(url):
    with pytest.raises(ValidationError) as caught:
        normalize_dashboard_url(url)
    assert message_of(caught) == "The dashboard URL must start with http:// or https://."


@pytest.mark.parametrize(
    "url", ["http://admin:secret@ray-head:8265", "http://admin@ray-head:8265", "http://:tok@ray-head"]
)
def test_credentials_in_the_url_are_refused_pointing_to_the_token_field(url):
    with pytest.raises(ValidationError) as caught:
        normalize_dashboard_url(url)
    message = message_of(caught)
    assert message.startswith("Do not put credentials in the URL")
    assert "token field" in message


def test_the_credentials_message_does_not_echo_the_secret():
    with pytest.raises(ValidationError) as caught:
        normalize_dashboard_url("http://admin:hunter2@ray-head:8265")
    assert "hunter2" not in message_of(caught)


def test_a_url_without_a_host_is_refused():
    with pytest.raises(ValidationError) as caught:
        normalize_dashboard_url("http:///api")
    assert message_of(caught) == "The dashboard URL has no host name."


@pytest.mark.parametrize(
    "url", ["http://ray-head:8265/?token=abc", "http://ray-head:8265/#/overview", "http://ray-head:8265?x"]
)
def test_a_query_string_or_fragment_is_refused(url):
    with pytest.raises(ValidationError) as caught:
        normalize_dashboard_url(url)
    assert message_of(caught) == "The dashboard URL must not have a query string or fragment."


@pytest.mark.parametrize("url", ["http://ray-head:99999", "http://ray-head:port", "http://ray-head:-1"])
def test_a_bad_port_is_refused(url):
    with pytest.raises(ValidationError) as caught:
        normalize_dashboard_url(url)
    assert message_of(caught) == "The dashboard URL has an invalid port."


# --- check_network_policy --------------------------------------------------------------------


def test_even_loopback_is_refused_when_no_networks_are_configured(db, settings):
    # Fail closed: a Fleetdeck that may call anything lets whoever registers a URL read its neighbours.
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    with pytest.raises(ValidationError) as caught:
        check_network_policy("http://127.0.0.1:8265")
    assert "a network entry 127.0.0.1/32" in message_of(caught)


def test_loopback_is_allowed_when_listed_as_make_run_and_the_tests_list_it(db, settings):
    # ::1 is the IPv6 twin of 127.0.0.1; "localhost" resolves to it on dual-stack hosts.
    settings.FLEETDECK_CLUSTER_NETWORKS = ["127.0.0.0/8", "::1/128"]
    assert check_network_policy("http://127.0.0.1:8265") is None
    assert check_network_policy("http://[::1]:8265") is None


def test_the_cloud_metadata_address_is_refused(db, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    with pytest.raises(ValidationError) as caught:
        check_network_policy("http://169.254.169.254")
    assert message_of(caught) == "169.254.169.254 resolves to 169.254.169.254, an address Fleetdeck never calls."


def test_the_cloud_metadata_address_is_refused_even_inside_the_allow_list(db, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = ["169.254.0.0/16", "0.0.0.0/0"]
    with pytest.raises(ValidationError) as caught:
        check_network_policy("http://169.254.169.254:80")
    assert "an address Fleetdeck never calls" in message_of(caught)


def test_the_metadata_address_is_refused_when_written_as_ipv4_mapped_ipv6(db, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    with pytest.raises(ValidationError) as caught:
        check_network_policy("http://[::ffff:169.254.169.254]")
    assert "an address Fleetdeck never calls" in message_of(caught)


@pytest.mark.parametrize("host", ["[fd00:ec2::254]", "100.100.100.200"])
def test_metadata_services_outside_link_local_are_refused(db, settings, host):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    with pytest.raises(ValidationError) as caught:
        check_network_policy(f"http://{host}")
    assert "an address Fleetdeck never calls" in message_of(caught)


@pytest.mark.parametrize("host", ["0.0.0.0", "224.0.0.1", "[fe80::1]"])
def test_unspecified_multicast_and_link_local_addresses_are_refused(db, settings, host):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    with pytest.raises(ValidationError) as caught:
        check_network_policy(f"http://{host}:8265")
    assert "an address Fleetdeck never calls" in message_of(caught)


def test_an_address_outside_the_allow_list_is_refused(db, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = ["10.0.0.0/8"]
    with pytest.raises(ValidationError) as caught:
        check_network_policy("http://127.0.0.1:8265")
    assert message_of(caught) == (
        "127.0.0.1 resolves to 127.0.0.1, which the network allow-list does not cover, so Fleetdeck did not call "
        "it. To allow it, an administrator adds a network entry 127.0.0.1/32 (Admin › Network allow-list), or lists "
        "the network in FLEETDECK_CLUSTER_NETWORKS."
    )


def test_an_address_inside_the_allow_list_is_allowed(db, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = ["10.0.0.0/8", "127.0.0.0/8"]
    assert check_network_policy("http://127.0.0.1:8265") is None


def test_an_unresolvable_host_is_refused(db, settings):
    settings.FLEETDECK_CLUSTER_NETWORKS = []
    with pytest.raises(ValidationError) as caught:
        check_network_policy("http://nonexistent.invalid:8265")
    assert message_of(caught) == "The host 'nonexistent.invalid' cannot be resolved."


# --- labels ----------------------------------------------------------------------------------


def test_validate_labels_returns_the_labels_sorted_by_key():
    labels = validate_labels({"region": "eu-west-1", "env": "prod", "team.example.com/owner": "vision"})
    assert list(labels.items()) == [("env", "prod"), ("region", "eu-west-1"), ("team.example.com/owner", "vision")]


@pytest.mark.parametrize("empty", [None, ""])
def test_no_labels_are_an_empty_dict(empty):
    assert validate_labels(empty) == {}


def test_an_empty_label_value_is_allowed():
    assert validate_labels({"canary": ""}) == {"canary": ""}


def test_labels_that_are_not_an_object_are_refused():
    with pytest.raises(ValidationError) as caught:
        validate_labels(["env=prod"])
    assert message_of(caught) == "Labels must be an object of key: value strings."


def test_more_than_the_maximum_number_of_labels_is_refused():
    with pytest.raises(ValidationError) as caught:
        validate_labels({f"k{i}": "v" for i in range(MAX_LABELS + 1)})
    assert message_of(caught) == f"At most {MAX_LABELS} labels."


def test_exactly_the_maximum_number_of_labels_is_allowed():
    assert len(validate_labels({f"k{i}": "v" for i in range(MAX_LABELS)})) == MAX_LABELS


@pytest.mark.parametrize("key", ["Env", "-env", "env-", "has space", "x" * 64, ""])
def test_an_invalid_label_key_is_refused_naming_the_key(key):
    with pytest.raises(ValidationError) as caught:
        validate_labels({key: "v"})
    assert message_of(caught).startswith(f"Label key {key!r} is invalid")


def test_a_label_key_of_63_characters_is_allowed():
    assert validate_labels({"k" * 63: "v"}) == {"k" * 63: "v"}


@pytest.mark.parametrize("value", ["has space", "a/b", "-lead", "x" * 64, 3, None])
def test_an_invalid_label_value_is_refused_naming_key_and_value(value):
    with pytest.raises(ValidationError) as caught:
        validate_labels({"env": value})
    assert message_of(caught).startswith(f"Label value {value!r} for 'env' is invalid")


def test_parse_labels_text_reads_comma_separated_pairs():
    assert parse_labels_text("env=prod, region=eu") == {"env": "prod", "region": "eu"}


def test_parse_labels_text_reads_one_pair_per_line_and_skips_blanks():
    assert parse_labels_text("env = prod\n\nregion=eu,\n") == {"env": "prod", "region": "eu"}


def test_parse_labels_text_of_nothing_is_empty():
    assert parse_labels_text("") == {}
    assert parse_labels_text(" , \n ") == {}


def test_parse_labels_text_refuses_a_chunk_without_equals():
    with pytest.raises(ValidationError) as caught:
        parse_labels_text("env=prod, canary")
    assert message_of(caught) == "Label 'canary' needs the form key=value."


def test_parse_labels_text_validates_what_it_parsed():
    with pytest.raises(ValidationError) as caught:
        parse_labels_text("Env=prod")
    assert message_of(caught).startswith("Label key 'Env' is invalid")


def test_labels_text_writes_the_form_field_text():
    assert labels_text({"env": "prod", "region": "eu"}) == "env=prod, region=eu"
    assert labels_text({}) == ""
    assert labels_text(None) == ""


def test_labels_round_trip_through_text():
    labels = {"canary": "", "env": "prod", "team.example.com/owner": "vision"}
    assert parse_labels_text(labels_text(labels)) == labels
    assert labels_text(parse_labels_text("env=prod, canary=")) == "canary=, env=prod"
