"""The capacity planner's form: what the page asks, turned into the request `capacity.plan_capacity` reads."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms

from apps.accounts import access
from apps.fleet.models import Deployment
from apps.llm import capacity
from apps.llm.accelerators import GIB, KNOWN_ACCELERATORS

OTHER = "other"
# The service names the request's keys; these are the page's names for the ones it spells differently.
FIELD_OF = {"gpu_memory_bytes": "gpu_memory_gib"}


def seen_models(user) -> Any:
    """The deployments whose model config an operator gave, in the user's teams only: another team's model is
    neither offered nor accepted by id."""
    return (
        access.visible(user, Deployment)
        .filter(llm_model_config__isnull=False, removed_at__isnull=True)
        .select_related("application__cluster")
        .order_by("application__cluster__name", "application__name", "name")
    )


class PlannerForm(forms.Form):
    config = forms.CharField(
        required=False,
        label="The model's config.json",
        widget=forms.Textarea(attrs={"rows": 12, "class": "mono", "spellcheck": "false"}),
        help_text="Paste it from the model's page on the Hugging Face Hub: Fleetdeck does not download it.",
    )
    model = forms.ModelChoiceField(
        queryset=Deployment.objects.none(),
        required=False,
        label="Or pick a model Fleetdeck has seen",
        empty_label="—",
        help_text="Deployments of your teams whose config.json an operator gave on the deployment page.",
    )
    accelerator = forms.ChoiceField(
        choices=[(name, name) for name in KNOWN_ACCELERATORS] + [(OTHER, "Other: give its memory")],
        initial="H100",
        label="Accelerator (Ray accelerator type)",
    )
    gpu_memory_gib = forms.FloatField(
        required=False,
        min_value=0.001,
        max_value=4096,
        label="GPU memory (GiB)",
        help_text="As CUDA reports it. Needed for Other; for a known type it replaces the table's figure.",
        widget=forms.NumberInput(attrs={"step": "any"}),
    )
    tensor_parallel_size = forms.IntegerField(initial=1, label="tensor_parallel_size")
    pipeline_parallel_size = forms.IntegerField(initial=1, label="pipeline_parallel_size")
    gpu_memory_utilization = forms.FloatField(
        initial=0.9, label="gpu_memory_utilization", widget=forms.NumberInput(attrs={"step": "any"})
    )
    max_model_len = forms.IntegerField(
        required=False,
        label="max_model_len",
        help_text="Empty: the model's context length. -1: vLLM fits it to the KV cache (vLLM 0.14 and later).",
    )
    max_num_seqs = forms.IntegerField(required=False, label="max_num_seqs", help_text="Empty: vLLM's default.")
    max_num_batched_tokens = forms.IntegerField(
        required=False, label="max_num_batched_tokens", help_text="Empty: vLLM's default."
    )
    kv_cache_dtype = forms.ChoiceField(
        choices=[(name, name) for name in capacity.KV_CACHE_DTYPES], initial="auto", label="kv_cache_dtype"
    )
    enforce_eager = forms.BooleanField(required=False, label="enforce_eager (no CUDA graphs)")
    vllm_version = forms.CharField(
        required=False,
        max_length=32,
        label="vLLM version",
        help_text="Empty: the vLLM the newest Ray pins. Its memory accounting changed between releases.",
    )

    def __init__(self, user, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Declared above as a ModelChoiceField; `fields` is typed as plain Fields.
        cast(forms.ModelChoiceField, self.fields["model"]).queryset = seen_models(user)

    def clean_config(self) -> dict | None:
        text = self.cleaned_data["config"].strip()
        if not text:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"This is not JSON: {exc.msg} at line {exc.lineno}.") from exc
        except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, or [[[[…]]]]
            raise forms.ValidationError(
                "This is not a config.json: a number is too long or it nests too deeply."
            ) from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("A config.json is one JSON object: {…}.")
        return value

    def clean(self) -> dict:
        super().clean()
        data = self.cleaned_data  # what Form.clean returns; its stub says it may be None
        pasted, picked = data.get("config"), data.get("model")
        if pasted is not None and picked is not None:
            self.add_error("config", "Paste a config.json or pick a model, not both.")
        elif pasted is None and picked is None and not self.has_error("config") and not self.has_error("model"):
            self.add_error("config", "Paste the model's config.json, or pick a model Fleetdeck has seen.")
        if (
            data.get("accelerator") == OTHER
            and data.get("gpu_memory_gib") is None
            and not self.has_error("gpu_memory_gib")
        ):
            given = picked.llm_gpu_memory_gib if picked is not None else None
            if given is None:
                self.add_error("gpu_memory_gib", "Give the GPU memory of an accelerator Fleetdeck does not know.")
            else:
                data["gpu_memory_gib"] = given
        return data

    def payload(self) -> dict[str, Any]:
        """The planner's request; an empty field is left out, so the service applies vLLM's default."""
        data = self.cleaned_data
        picked = data["model"]
        request = {
            "config": picked.llm_model_config if picked is not None else data["config"],
            "accelerator": None if data["accelerator"] == OTHER else data["accelerator"],
            "gpu_memory_bytes": round(data["gpu_memory_gib"] * GIB) if data["gpu_memory_gib"] else None,
            "enforce_eager": data["enforce_eager"],
            "vllm_version": data["vllm_version"] or None,
        }
        for name in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "gpu_memory_utilization",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_dtype",
        ):
            request[name] = data[name]
        return {key: value for key, value in request.items() if value is not None}

    def refuse(self, exc: capacity.PlanInputError) -> None:
        """Show the planner's refusal next to the field it names (the whole form's, for one the page lacks)."""
        name = FIELD_OF.get(exc.field, exc.field)
        if name == "config" and self.cleaned_data.get("model") is not None:
            name = "model"
        self.add_error(name if name in self.fields else None, exc.message)
