"""pb_utils.ModelConfig (what `auto_complete_config` may change) and Triton's look-ups in a model
configuration dict."""

from __future__ import annotations

import json
from typing import Any, Optional


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> Optional[dict[str, Any]]:
    for entry in model_config.get("input", []):
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> Optional[dict[str, Any]]:
    for entry in model_config.get("output", []):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


class ModelConfig:
    """The model configuration handed to `auto_complete_config`; only max_batch_size, the scheduler,
    inputs, outputs and the transaction policy may be changed."""

    def __init__(self, model_config: Any) -> None:
        config = json.loads(model_config) if isinstance(model_config, (str, bytes)) else dict(model_config)
        config.setdefault("name", "")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._model_config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                "configuration specified max_batch_size %s, but in auto-complete-config function for "
                "model '%s' specified max_batch_size %s" % (current, self._name(), max_batch_size)
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    "Configuration specified scheduling_choice as '%s', but auto-complete-config function "
                    "for model '%s' tries to set scheduling_choice as 'dynamic_batching'"
                    % (scheduler, self._name())
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple) -> None:
        model = self._name()
        for key in tensor:
            if key not in allowed:
                listed = ", ".join("'%s'" % a for a in allowed[:-1]) + " and '%s'" % allowed[-1]
                raise ValueError(
                    "%s '%s' in auto-complete-config function for model '%s' contains property other "
                    "than %s." % (kind, tensor.get("name"), model, listed)
                )
        if "name" not in tensor:
            raise ValueError(
                "%s in auto-complete-config function for model '%s' is missing 'name' property."
                % (kind, model)
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    "%s '%s' in auto-complete-config function for model '%s' is missing '%s' property."
                    % (kind, tensor["name"], model, key)
                )
        for current in self._model_config[kind]:
            if current.get("name") != tensor["name"]:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    "unable to load model '%s', configuration expects datatype %s for %s '%s', model "
                    "provides %s" % (model, current_type, kind, tensor["name"], tensor["data_type"])
                )
            if current.get("dims") and current["dims"] != tensor["dims"]:
                raise ValueError(
                    "model '%s', tensor '%s': the model expects dims %s but the model configuration "
                    "specifies dims %s" % (model, tensor["name"], tensor["dims"], current["dims"])
                )
            if (
                kind == "input" and "optional" in current and "optional" in tensor
                and current["optional"] != tensor["optional"]
            ):
                raise ValueError(
                    "model '%s', tensor '%s': the model expects optional %s but the model configuration "
                    "specifies optional %s" % (model, tensor["name"], tensor["optional"], current["optional"])
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model '%s' contains "
                    "property other than 'decoupled'." % self._name()
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            if "decoupled" in policy and policy["decoupled"] != transaction_policy_dict["decoupled"]:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model '%s', which is "
                    "already set to '%s'." % (self._name(), policy["decoupled"])
                )
            policy["decoupled"] = transaction_policy_dict["decoupled"]
