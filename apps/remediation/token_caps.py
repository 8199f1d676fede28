"""Token caps of a deployment that reads them from its user_config: the token-sum batch limit (R4)
and the input caps (R3), from a token-sum calibration (or a calibrated mix of requests whose tokens
are known) and the memory budget. Pure functions; every value comes with the reason it has that
value."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from apps.calibration.mix import QUANTILE_TEXT, largest_tail_increment
from apps.remediation.measurements import Budget, Memory, mib
from apps.remediation.plan_choice import Plan

if TYPE_CHECKING:
    # sizing imports this module to fill its values.
    from apps.remediation.sizing import RemedyValues

# A batch limit may extrapolate the curve's last step this far past the largest calibrated sum;
# further out a straight line is a guess, and a calibration of larger sums is the answer.
MAX_EXTRAPOLATION = 4

INPUT_CAPS = ("max_prompt_tokens", "max_tokens_cap")


def request_tokens(user_config: dict | None) -> tuple[int | None, str]:
    """The most tokens one request can bring to a batch: the deployment's own caps, when its
    user_config sets both (max_prompt_tokens + max_tokens_cap); else None, with the reason."""
    config = user_config or {}
    caps = {name: config.get(name) for name in INPUT_CAPS}
    missing = [name for name, value in caps.items() if not _is_cap(value)]
    if missing:
        return None, f"the user_config caps no {' and no '.join(missing)}"
    tokens = sum(caps.values())
    return tokens, (
        f"a request brings at most {tokens} tokens (user_config max_prompt_tokens {caps['max_prompt_tokens']} + "
        f"max_tokens_cap {caps['max_tokens_cap']})"
    )


def batch_tokens(
    user_config: dict | None, curve, budget: Budget | None, per_node: int | None, concurrency: int | None
) -> RemedyValues:
    """R4: the largest batch token sum whose measured peak fits one replica's share of the node
    budget (the budget ÷ the replicas per node that R1 sized at its concurrency, which R2 keeps
    to). A patch only
    where the deployment reads the limit from its user_config (a `max_batch_tokens` key);
    elsewhere the limit lives in code and the value is guidance."""
    config = user_config or {}
    if budget is None or not per_node:
        return {
            "patch": None,
            "value": {"max_batch_tokens": None},
            "largest_fitting_tokens": None,
            "warnings": [],
            "reasons": {
                "max_batch_tokens": (
                    "Not computed: there is no memory budget (no kill message and no node reading) to fit a batch "
                    "into. Collect metrics or wait for a kill, then re-plan."
                )
            },
        }
    share = budget.bytes_per_node // per_node
    largest = int(max(x for x, _ in curve.points))
    ceiling = MAX_EXTRAPOLATION * largest
    limit = largest_token_sum(curve, share, ceiling)
    share_text = (
        f"one replica's share of the budget is {mib(share)} ({mib(budget.bytes_per_node)} per node ÷ {per_node} "
        f"replica(s) per node at max_ongoing_requests {concurrency}; the safety margin is already in the budget)"
    )
    warnings: list[str] = []
    if limit == 0:
        warnings.append(
            f"The replica at rest ({mib(curve.baseline_bytes)}) already needs more than its share ({mib(share)}): no "
            "batch fits. Give the deployment more memory per node or fewer replicas per node."
        )
        return {
            "patch": None,
            "value": {"max_batch_tokens": None},
            "largest_fitting_tokens": 0,
            "warnings": warnings,
            "reasons": {"max_batch_tokens": f"Not computed: {share_text}, and nothing fits it."},
        }
    reason = (
        f"{limit}: a batch of {limit} tokens peaks at about {mib(curve.peak_at(limit))} on calibration "
        f"#{curve.calibration_id} ({curve.device}); {share_text}."
    )
    if limit == ceiling:
        reason += (
            f" Capped at {MAX_EXTRAPOLATION} × the largest calibrated sum ({largest}): the budget may hold more, but "
            "that far out the curve is a straight-line guess. Calibrate larger token sums to go further."
        )
    value = limit
    existing = config.get("max_batch_tokens")
    if isinstance(existing, int) and not isinstance(existing, bool) and 1 <= existing < limit:
        value = existing
        reason += f" It is already {existing}, lower than computed: kept."
    if largest < value < ceiling:
        warnings.append(
            f"{value} tokens is beyond the largest calibrated sum ({largest}): the curve's last step is extrapolated. "
            f"Calibrate up to {value} tokens to confirm it."
        )
    tokens, _ = request_tokens(config)
    if tokens is not None and tokens > value:
        warnings.append(
            f"One request may bring {tokens} tokens (its caps) but a batch holds at most {value}: larger requests "
            "would be refused. Lower the input caps (R3) or give the replica more memory."
        )
    patch = {"user_config": {"max_batch_tokens": value}} if "max_batch_tokens" in config else None
    return {
        "patch": patch,
        "value": {"max_batch_tokens": value},
        "largest_fitting_tokens": limit,
        "reasons": {"max_batch_tokens": reason},
        "warnings": warnings,
    }


def reads_input_caps(user_config: dict | None) -> bool:
    """Whether the deployment takes an input cap from its user_config, so that R3 is a config change."""
    return any(name in (user_config or {}) for name in INPUT_CAPS)


def input_caps(
    user_config: dict | None,
    memory: Memory | None,
    budget: Budget | None,
    plan: Plan | None,
    curve,
    batch: RemedyValues | None,
) -> RemedyValues:
    """R3 where the deployment reads its caps from user_config: the most tokens one request may
    bring (prompt plus requested) so that a replica holding as many requests as R1 sized fits its
    share of the memory budget, each token priced at the token-sum calibration's steepest step,
    and no more than the batch limit the deployment enforces (a larger request could never join a
    batch). Caps are only lowered, in their own proportion; caps that fit are kept, and without a
    per-token measurement and a budget nothing is computed. From a calibrated mix of requests the
    cap is where the mix's tail would break the budget (`_fit_from_mix`)."""
    config = user_config or {}
    caps = {name: config.get(name) for name in INPUT_CAPS}
    # A cap the deployment reads but leaves null is one Fleetdeck may set; one it does not read at all, or holds
    # as something other than a token count, is not.
    unset = [name for name in INPUT_CAPS if name in config and config[name] is None]
    unusable = [name for name, value in caps.items() if name not in unset and not _is_cap(value)]
    if unusable:
        return {
            "patch": None,
            "value": {},
            "reasons": {},
            "warnings": [
                f"The user_config has no usable {' and no '.join(unusable)} (a whole number of tokens, at least 1): a "
                "request's size has no bound Fleetdeck can set. Read both caps from user_config and the wizard "
                "computes them from measured memory."
            ],
        }
    mixed = curve is not None and curve.axis == "concurrency" and getattr(curve, "is_mixed", False)
    if curve is None or (curve.axis != "token_sum" and not mixed):
        measured = (
            f"calibration #{curve.calibration_id} measured memory per request, not per token"
            if curve is not None
            else "memory per token is not measured"
        )
        return _caps_waiting(
            f"No caps are computed: {measured}, and a cap sized without it could be a guess that lets requests "
            "use more memory. Calibrate on the token-sum axis (a calibration_batch(token_sum) method), then re-plan."
        )
    if budget is None or plan is None or memory is None:
        return _caps_waiting(
            "No caps are computed: there is no memory budget to fit a request into (no kill message and no node "
            "reading). Collect metrics or wait for a kill, then re-plan."
        )
    if mixed:
        priced = _fit_from_mix(curve, memory, budget, plan)
        if isinstance(priced, dict):
            return priced
        fit, why, largest, largest_text = priced
    else:
        per_token = max(curve.per_unit_bytes, 1)
        per_node = max(plan.per_node, 1)
        share = budget.bytes_per_node // per_node
        room = share - memory.baseline_bytes
        fit = int(room // (plan.concurrency * per_token)) if room > 0 else 0
        why = (
            f"one replica's share of the budget is {mib(share)} ({mib(budget.bytes_per_node)} per node ÷ {per_node} "
            f"replica(s)); less its {mib(memory.baseline_bytes)} at rest, {mib(max(room, 0))} holds "
            f"{plan.concurrency} request(s) at once (max_ongoing_requests {plan.concurrency}) of at most {fit} tokens "
            f"at {per_token / 1024:,.0f} KiB per token (calibration #{curve.calibration_id}'s steepest step)"
        )
        largest = int(max(x for x, _ in curve.points))
        largest_text = f"the largest calibrated sum ({largest})"
    batch_limit = (
        batch.get("value", {}).get("max_batch_tokens") if batch is not None and "max_batch_tokens" in config else None
    )
    if batch_limit and batch_limit < fit:
        fit = batch_limit
        why += f"; a request larger than the batch limit of {batch_limit} tokens (R4) could never join a batch"
    if fit < 2:
        return {
            "patch": None,
            "not_applicable": True,
            "value": {},
            "reasons": {name: f"Not computed: {why}." for name in INPUT_CAPS},
            "warnings": [
                f"Not even a request of two tokens fits: {why}. No input cap prevents the kill: give the deployment "
                "more memory per node or fewer replicas per node."
            ],
        }
    if unset:
        return _caps_for_unset(caps, unset, fit, why)
    total = caps["max_prompt_tokens"] + caps["max_tokens_cap"]
    if total <= fit:
        kept = f"kept: a request brings at most {total} tokens and up to {fit} fit ({why})."
        return {
            "patch": {"user_config": dict(caps)},
            "value": dict(caps),
            "warnings": [],
            "reasons": {name: f"{value}, {kept}" for name, value in caps.items()},
        }
    prompt = max(1, min(caps["max_prompt_tokens"], fit * caps["max_prompt_tokens"] // total))
    generated = max(1, min(caps["max_tokens_cap"], fit - prompt))
    split = (
        f"{prompt + generated} tokens a request, split as the current caps are ({caps['max_prompt_tokens']} + "
        f"{caps['max_tokens_cap']})"
    )
    warnings = []
    if prompt + generated > largest:
        warnings.append(
            f"{prompt + generated} tokens is beyond {largest_text}: the memory per token is extrapolated. Calibrate "
            "larger requests to confirm it."
        )
    new = {"max_prompt_tokens": prompt, "max_tokens_cap": generated}
    return {
        "patch": {"user_config": new},
        "value": new,
        "warnings": warnings,
        "reasons": {name: f"{value}, down from {caps[name]}: {split}; {why}." for name, value in new.items()},
    }


def _fit_from_mix(curve, memory: Memory, budget: Budget, plan: Plan) -> tuple[int, str, int, str] | RemedyValues:
    """The most tokens one request may bring, from a calibrated mix: how far the mix's heaviest
    request may grow, at its share, before c requests drawn from the mix pass one replica's share
    of the budget at the sizing quantile (where the mix's tail breaks the budget), priced at the
    costliest per token of the requests whose tokens are known. (fit, why, the largest measured
    request's tokens, how to name it), or a waiting R3 when no request of the mix has tokens."""
    per_node = max(plan.per_node, 1)
    share = budget.bytes_per_node // per_node
    room = share - memory.baseline_bytes
    c = plan.concurrency
    tail = largest_tail_increment([e.increment_bytes for e in curve.mix], [e.share for e in curve.mix], c, max(room, 0))
    heaviest = max(curve.mix, key=lambda e: e.increment_bytes)
    where = (
        f"one replica's share of the budget is {mib(share)} ({mib(budget.bytes_per_node)} per node ÷ {per_node} "
        f"replica(s)); less its {mib(memory.baseline_bytes)} at rest, {mib(max(room, 0))} holds {c} requests drawn "
        f"from calibration #{curve.calibration_id}'s mix at the {QUANTILE_TEXT} while its heaviest request "
        f"({heaviest.label}, {heaviest.share:g} % of traffic, +{mib(heaviest.increment_bytes)} measured) adds at "
        f"most {mib(tail)}"
    )
    priced = [e for e in curve.mix if e.tokens]
    if not priced:
        return _caps_waiting(
            f"No caps are computed: {where}, but no request of the mix says how many tokens it brings, so that "
            "memory cannot be turned into a token cap. Give each request of the mix its tokens and calibrate again."
        )
    costliest = max(priced, key=lambda e: e.increment_bytes / e.tokens)
    per_token = max(math.ceil(costliest.increment_bytes / costliest.tokens), 1)
    fit = tail // per_token
    why = (
        f"{where}, which at {per_token / 1024:,.0f} KiB per token (the costliest per token of the mix's requests, "
        f"{costliest.label} with {costliest.tokens} tokens) is {fit} tokens"
    )
    largest = max(e.tokens for e in priced)
    return fit, why, largest, f"the largest request of the mix ({largest} tokens)"


def _caps_waiting(why: str) -> RemedyValues:
    return {
        "patch": None,
        "waiting": True,
        "why_waiting": why,
        "value": {},
        "reasons": {name: why for name in INPUT_CAPS},
        "warnings": [],
    }


def _is_cap(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def largest_token_sum(curve, limit_bytes: int, ceiling: int) -> int:
    """The largest whole token sum up to `ceiling` whose peak on `curve`, and that of every smaller
    sum, stays within `limit_bytes`; 0 when not even the replica at rest fits. Smaller sums count
    too because a dip in a measured curve is noise, not room."""

    def fits(token_sum: int) -> bool:
        worst = max((peak for x, peak in curve.points if x <= token_sum), default=0)
        return max(curve.peak_at(token_sum), worst) <= limit_bytes

    if not fits(0):
        return 0
    low, high = 0, ceiling
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


# With no caps to keep the proportion of, a request's tokens are split as a chat request's usually are: most of
# them prompt, a quarter generated.
PROMPT_SHARE = 0.75


def _caps_for_unset(caps: dict, unset: list[str], fit: int, why: str) -> RemedyValues:
    """R3 where the deployment reads its caps but has them null: set them so a request fits, saying so."""
    prompt = caps["max_prompt_tokens"] or max(1, int(fit * PROMPT_SHARE))
    generated = caps["max_tokens_cap"] or max(1, fit - prompt)
    prompt, generated = min(prompt, fit - 1), min(generated, fit - min(prompt, fit - 1))
    value = {"max_prompt_tokens": prompt, "max_tokens_cap": generated}
    reasons = {
        name: (
            f"{value[name]}: null today, so a request's size had no bound; {prompt + generated} tokens a request fit "
            f"({why}), {PROMPT_SHARE:.0%} of them prompt"
            if name in unset
            else f"{value[name]}, kept or lowered so the request fits ({why})"
        )
        for name in INPUT_CAPS
    }
    return {"patch": {"user_config": value}, "value": value, "warnings": [], "reasons": reasons}
