"""Typed ``--json`` documents: one model per command output.

Every command that takes ``--json`` builds one of the :class:`Report` models below and prints it with
:func:`zebractl.cli._common.emit_json`, so stdout carries exactly one JSON document whose layout is
this package (one module per command). ``zebractl schema export`` writes the JSON Schema of each report to
``schemas/reports/<command>.schema.json`` (see :data:`REPORTS`).

JSON has no Infinity or NaN, and neither do reports: every float is finite (the base class refuses
non-finite floats, and the config schemas refuse them in presets, recipes and ``--set``), so a
non-finite value is a bug that fails when the report is built.

Nothing heavy is imported here: only pydantic and the config schemas.
"""

from __future__ import annotations

from zebractl.schemas.reports.base import Report, Split
from zebractl.schemas.reports.compare import (
    CompareCheck,
    CompareConfigChange,
    CompareCurves,
    CompareDifference,
    CompareEvalNotCompared,
    CompareEvalRow,
    CompareFinetune,
    CompareFinetuneEvalRow,
    CompareLossPoint,
    CompareLossRow,
    CompareModelDifference,
    CompareReport,
    CompareSide,
    CompareStart,
    CompareThroughput,
    CompareThroughputSide,
    CompareValLoss,
    CompareVerdict,
)
from zebractl.schemas.reports.config import (
    ConfigDifference,
    ConfigDiffReport,
    ConfigShowReport,
    ConfigValidateReport,
    ConfigValidateResult,
    PresetEntry,
    PresetsReport,
    RecipeEntry,
    RecipesReport,
)
from zebractl.schemas.reports.convert import (
    ConvertReport,
    ModelVerifyReport,
    VerifyTier,
)
from zebractl.schemas.reports.data import (
    FileDigest,
    Manifest,
    ManifestChat,
    ManifestChatTemplate,
    ManifestOptions,
    ManifestRun,
    ManifestShard,
    ManifestSource,
    ManifestTokenizer,
    ManifestTotals,
    PrepareReport,
    ShardFiles,
    SplitTotals,
    VerifyChecked,
    VerifyReport,
)
from zebractl.schemas.reports.doctor import (
    DoctorCommand,
    DoctorModule,
    DoctorReport,
    EnvGpu,
    EnvPath,
    EnvReport,
)
from zebractl.schemas.reports.eval import (
    EvalMetric,
    EvalReport,
    EvalTaskResult,
)
from zebractl.schemas.reports.generate import ChatReport, ChatTurn, GenerateReport, GenerateSampling
from zebractl.schemas.reports.plan import (
    ForwardFlops,
    PlanBatch,
    PlanFit,
    PlanFlops,
    PlanMemory,
    PlanParameters,
    PlanPattern,
    PlanReport,
    PlanSequence,
    PlanTimeToTrain,
    PlanTokens,
    SublayerParameters,
)
from zebractl.schemas.reports.train import (
    PreflightCheck,
    TrainCheckReport,
    TrainReport,
    WarmupReport,
)

REPORTS: tuple[type[Report], ...] = (
    PlanReport,
    ConfigShowReport,
    ConfigValidateReport,
    ConfigDiffReport,
    PresetsReport,
    RecipesReport,
    PrepareReport,
    VerifyReport,
    TrainReport,
    WarmupReport,
    ConvertReport,
    ModelVerifyReport,
    EvalReport,
    GenerateReport,
    ChatReport,
    CompareReport,
    TrainCheckReport,
    DoctorReport,
    EnvReport,
)
"""Every --json document, one per command; each has a JSON Schema in schemas/reports/."""

__all__ = [
    "REPORTS",
    "GenerateReport",
    "GenerateSampling",
    "ChatReport",
    "ChatTurn",
    "Report",
    "Split",
    "SublayerParameters",
    "PlanParameters",
    "PlanPattern",
    "ForwardFlops",
    "PlanFlops",
    "PlanTokens",
    "PlanTimeToTrain",
    "PlanBatch",
    "PlanMemory",
    "PlanFit",
    "PlanSequence",
    "PlanReport",
    "ConfigShowReport",
    "ConfigValidateResult",
    "ConfigValidateReport",
    "ConfigDifference",
    "ConfigDiffReport",
    "PresetEntry",
    "PresetsReport",
    "RecipeEntry",
    "RecipesReport",
    "ManifestTokenizer",
    "ManifestOptions",
    "SplitTotals",
    "ManifestTotals",
    "FileDigest",
    "ShardFiles",
    "ManifestShard",
    "ManifestSource",
    "ManifestRun",
    "ManifestChatTemplate",
    "ManifestChat",
    "Manifest",
    "PrepareReport",
    "VerifyChecked",
    "VerifyReport",
    "TrainReport",
    "WarmupReport",
    "ConvertReport",
    "VerifyTier",
    "ModelVerifyReport",
    "EvalMetric",
    "EvalTaskResult",
    "EvalReport",
    "CompareStart",
    "CompareConfigChange",
    "CompareSide",
    "CompareLossRow",
    "CompareModelDifference",
    "CompareLossPoint",
    "CompareCurves",
    "CompareValLoss",
    "CompareVerdict",
    "CompareThroughputSide",
    "CompareThroughput",
    "CompareEvalRow",
    "CompareDifference",
    "CompareCheck",
    "CompareFinetuneEvalRow",
    "CompareEvalNotCompared",
    "CompareFinetune",
    "CompareReport",
    "PreflightCheck",
    "TrainCheckReport",
    "DoctorModule",
    "DoctorCommand",
    "DoctorReport",
    "EnvGpu",
    "EnvPath",
    "EnvReport",
]
