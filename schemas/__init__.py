"""The contract between every part of torchport: pydantic models, no other imports of ours.

JSON Schemas for the documents are generated from these models into `schemas/json/`
(`python -m schemas.generate`).
"""

from schemas._base import SCHEMA_VERSION
from schemas.dynamic_shapes import (
    ArgSpec,
    DimDeclaration,
    DynamicShapesSpec,
    dynamic_shapes_adapter,
    parse_dim_expression,
)
from schemas.environment import (
    MODEL_LIBRARIES,
    EnvironmentDescription,
    EnvironmentList,
    LibraryInfo,
    WorkerEnvironment,
)
from schemas.errors import ERROR_CODES, STAGES, ErrorBody, ErrorCode, SourceLocation, Stage
from schemas.graph import (
    Graph,
    GraphDocument,
    GraphNode,
    ModuleFrame,
    RangeConstraint,
    TensorMeta,
)
from schemas.job import ArtifactRef, JobPublic, JobStatus, StageEvent, WebhookDelivery
from schemas.options import (
    AotiOptions,
    DecompositionOptions,
    ExportOptions,
    TargetName,
    VerifyOptions,
)
from schemas.progress import Progress
from schemas.report import (
    ArtifactInfo,
    DecompositionReport,
    DraftIssue,
    DynamicShapeFix,
    DynamicShapesReport,
    Environment,
    InputSummary,
    ModelSummary,
    OutputCheck,
    ReportDocument,
    ReportWarning,
    RoundtripCheck,
    SampleCheck,
    SandboxReport,
    StageRecord,
    TargetResult,
    TraceAttempt,
    TracingReport,
    VerificationReport,
)
from schemas.signature import InputSpec, OutputSpec, PortabilityMapping, SignatureDocument

__all__ = [
    "ERROR_CODES",
    "MODEL_LIBRARIES",
    "SCHEMA_VERSION",
    "STAGES",
    "AotiOptions",
    "ArgSpec",
    "ArtifactInfo",
    "ArtifactRef",
    "DecompositionOptions",
    "DecompositionReport",
    "DimDeclaration",
    "DraftIssue",
    "DynamicShapeFix",
    "DynamicShapesReport",
    "DynamicShapesSpec",
    "Environment",
    "EnvironmentDescription",
    "EnvironmentList",
    "ErrorBody",
    "ErrorCode",
    "ExportOptions",
    "Graph",
    "GraphDocument",
    "GraphNode",
    "InputSpec",
    "InputSummary",
    "JobPublic",
    "JobStatus",
    "LibraryInfo",
    "ModelSummary",
    "ModuleFrame",
    "OutputCheck",
    "OutputSpec",
    "PortabilityMapping",
    "Progress",
    "RangeConstraint",
    "ReportDocument",
    "ReportWarning",
    "RoundtripCheck",
    "SampleCheck",
    "SandboxReport",
    "SignatureDocument",
    "SourceLocation",
    "Stage",
    "StageEvent",
    "StageRecord",
    "TargetName",
    "TargetResult",
    "TensorMeta",
    "TraceAttempt",
    "TracingReport",
    "VerificationReport",
    "VerifyOptions",
    "WebhookDelivery",
    "WorkerEnvironment",
    "dynamic_shapes_adapter",
    "parse_dim_expression",
]
