"""JSON Schemas for the custom resources in deploy/ that kubernetes-validate has no schema for.

Trimmed from KEDA 2.x's CRDs (keda.sh/v1alpha1) to the fields torchport uses, with unknown
fields refused, so that a misspelt key fails validation as it would when applied.
"""

from __future__ import annotations

from typing import Any

_METADATA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}

_SCALING_POLICY: dict[str, Any] = {
    "type": "object",
    "required": ["type", "value", "periodSeconds"],
    "properties": {
        "type": {"enum": ["Pods", "Percent"]},
        "value": {"type": "integer", "minimum": 1},
        "periodSeconds": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}

_SCALING_RULES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "items": _SCALING_POLICY},
    },
    "additionalProperties": False,
}

_REDIS_METADATA: dict[str, Any] = {
    "type": "object",
    "required": ["listName"],
    "properties": {
        key: {"type": "string"}
        for key in (
            "address",
            "addressFromEnv",
            "host",
            "hostFromEnv",
            "port",
            "portFromEnv",
            "passwordFromEnv",
            "usernameFromEnv",
            "databaseIndex",
            "listName",
            "listLength",
            "activationListLength",
            "enableTLS",
            "unsafeSsl",
        )
    },
    "additionalProperties": False,
}

SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                    },
                    "additionalProperties": False,
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "advanced": {
                    "type": "object",
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {
                                    "type": "object",
                                    "properties": {
                                        "scaleUp": _SCALING_RULES,
                                        "scaleDown": _SCALING_RULES,
                                    },
                                    "additionalProperties": False,
                                },
                            },
                            "additionalProperties": False,
                        },
                    },
                    "additionalProperties": False,
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "redis"},
                            "name": {"type": "string"},
                            "metadata": _REDIS_METADATA,
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {"enum": ["TriggerAuthentication"]},
                                },
                                "additionalProperties": False,
                            },
                        },
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

TRIGGER_AUTHENTICATION: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["secretTargetRef"],
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["parameter", "name", "key"],
                        "properties": {
                            "parameter": {"type": "string"},
                            "name": {"type": "string"},
                            "key": {"type": "string"},
                        },
                        "additionalProperties": False,
                    },
                }
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

BY_KIND: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): TRIGGER_AUTHENTICATION,
}
