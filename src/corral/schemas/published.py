"""Every model Corral publishes a JSON Schema for, by name, and the schema as published."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, TypeAdapter

from corral.schemas import epics, knowledge, protocol, views

MODELS: Mapping[str, type[BaseModel] | TypeAdapter[Any]] = {
    # --json (and the HTTP API)
    "Job": views.Job,
    "JobDetail": views.JobDetail,
    "JobShow": views.JobShow,
    "Attempt": views.Attempt,
    "JobEvent": views.JobEvent,
    "AgentEvent": views.AgentEvent,
    "PolicyEvaluation": views.PolicyEvaluation,
    "Trace": views.Trace,
    "Submitted": views.Submitted,
    "Cancelled": views.Cancelled,
    "Workspace": views.Workspace,
    "Requeued": views.Requeued,
    "Purged": views.Purged,
    "Version": views.Version,
    "KillSwitch": views.KillSwitch,
    "Pause": views.Pause,
    "Approval": views.Approval,
    "Incident": views.Incident,
    "RunReport": views.RunReport,
    "NoReport": views.NoReport,
    "UnifiedRun": views.UnifiedRun,
    "AuditReport": views.AuditReport,
    "GcReport": views.GcReport,
    "Budget": views.Budget,
    "BudgetSet": views.BudgetSet,
    "DarkLaunch": views.DarkLaunch,
    "PolicyCheck": views.PolicyCheck,
    "PolicyStats": views.PolicyStats,
    "ConfigShown": views.ConfigShown,
    "ConfigChecked": views.ConfigChecked,
    "EngineStatus": views.EngineStatus,
    "Breaker": views.Breaker,
    "BreakerReset": views.BreakerReset,
    "Escalation": views.Escalation,
    "EscalationCleared": views.EscalationCleared,
    "CoreEvent": views.CoreEvent,
    "TailedEvent": views.TailedEvent,
    "GuardCheck": views.GuardCheck,
    "Token": views.Token,
    "TokenCreated": views.TokenCreated,
    "WorldModel": views.WorldModel,
    "Baseline": views.Baseline,
    "Replay": views.Replay,
    "Epic": epics.Epic,
    "EpicShow": epics.EpicShow,
    "Learning": knowledge.Learning,
    "LearningShow": knowledge.LearningShow,
    "KnowledgeStats": knowledge.KnowledgeStats,
    # the core protocol
    "ProtocolJob": protocol.JOB.model,
    "ProtocolAttempt": protocol.ATTEMPT.model,
    "ProtocolPermit": protocol.PERMIT,
    "ProtocolResult": protocol.RESULT,
}
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of a model, as published: of what it prints (serialization mode)."""
    model = MODELS[name]
    if isinstance(model, TypeAdapter):
        schema = model.json_schema(mode="serialization", by_alias=True)
    else:
        schema = model.model_json_schema(mode="serialization", by_alias=True)
    return {"$schema": SCHEMA_DIALECT, "$id": f"{name}.json", **schema}


def schema_text(name: str) -> str:
    """The published file's text: stable key order, one trailing newline."""
    return json.dumps(json_schema(name), indent=2, sort_keys=True) + "\n"
