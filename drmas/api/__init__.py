"""What a plugin uses of drmas: the one module a plugin imports (see docs/extending.md for a complete example).

A plugin is a module listed in the config's `plugins` (or installed with a `drmas.plugins` entry point) that
registers components by name; a config then chooses them like the built-ins:

* an **orchestra** (`system.name`): the turn logic of one episode, a generator that yields `AgentTurn`s (sent
  back the reply text) and `ServiceCall`s (sent back the service's result) and returns an `EpisodeOutcome`.
  Registered with `@ORCHESTRAS.register(name, settings=MySystemSettings)`; built as
  ``factory(settings, agents_by_role, task)``, where `settings` is the filled `system` section (an instance of
  its settings class) and `agents_by_role` maps each configured role to the agent name that plays it. A
  factory with ``needs_retriever = True`` also gets ``retriever=`` and ``topk=`` from the `retrieval` section;
  every `agents.<name>.role` must name a registered role agent, unless the factory has ``role_labels = True``
  (its roles are labels: the external system's);
* **role agents** (`agents.<name>.role`): `RoleAgent` subclasses (prompting and parsing of one role; their
  `stop` strings end generation) and `ScriptedRole` subclasses (turns computed by code: no model, no sample),
  registered with `@AGENT_ROLES.register(name)`; the math system's `system.solver_prompts` /
  `verifier_prompts` name such agents, most simply subclasses of the built-in `SolverAgent` / `VerifierAgent` with
  worked examples of a task's own (bench/lookup.py);
* a **task** (`task.name`): problems with a train/test split and a grader, ``factory(settings) -> Task``,
  registered with `@TASKS.register(name, settings=MyTaskSettings)`;
* **services** (`Service`: objects with `call_batch(requests) -> results`, batched across episodes by the
  driver), which an orchestra owns in its `services` mapping; the sandbox for model-written code is one
  (`SandboxService`, and `AssertService` over it to run a solution against assert statements; docs/sandbox.md),
  its limits a `SandboxConfig` the system's settings embed (``sandbox: SandboxConfig = help_field(SandboxConfig,
  ...)`` makes `system.sandbox.*` keys, typed, checked and listed like the rest);
* **engines** (`rollout.engine`, `ENGINES`; `traits=EngineAbilities(...)` declares what one can do beyond the
  `Engine` protocol: adapters, engine arguments, top-p truncated log-probs, a package it needs) and **retrievers** (`retrieval.backend`, `RETRIEVERS`);
* **advantage estimators** (`algorithm.estimator`, `ADVANTAGE_ESTIMATORS`): ``estimator(batch, context) ->
  advantages``, one per row of the `AdvantageBatch` (the calls one model trains this step, with their groups'
  episode scores and call rewards; the same in the colocated and async loops), `context` the `EstimatorContext`
  (the `algorithm` section and the running per-agent reward statistics); and **policy losses** (`algorithm.loss`,
  `POLICY_LOSSES`): ``loss(inputs, alg) -> LossOutput`` over one micro-batch's `LossInputs` (current, proximal and
  behaviour log-probs, advantages, mask). docs/algorithms.md has the built-ins' formulas;
* **priming format sets** (`models.<id>.tiny.prime_system`, `PRIMING_FORMATS`): a `PrimingFormats` of reply
  templates (and prompt/reply pairs) that the tiny random test model is primed to write, so a plugin's own output
  format (`<verdict>accept</verdict>`, say) is written in its tests and smoke runs and its rewards vary;
* **tool-call parsers** (`TOOL_PARSERS`: a reply's text -> its content and `ParsedCall`s), for models whose
  template writes calls in another format than the built-in `hermes`. An agent is offered functions by
  `AgentTurn(..., tools=[...])` (OpenAI's definitions, rendered by the chat template). "Tool" in drmas means
  this, the functions a model calls; what the driver batches for an orchestra is a service. A parser's format
  can also be forced (`tool_choice` required through the gateway) when a grammar for it is registered under the
  same name (`TOOL_CALL_GRAMMARS`: (tools, tool_choice, parallel) -> a `Constraint`, e.g. an xgrammar
  structural tag; docs/gateway.md).

Settings classes are dataclasses subclassing `SystemSettings` / `TaskSettings`, every field declared with
`help_field(default, help)`, checks in `problems(where)` (see `Section`; `at_least` and `one_of` help), so
`system.*` / `task.*` are typed, checked and listed by `drmas config keys` like every drmas section.

Rewards: `EpisodeOutcome.reward` is the episode's task reward (held-out accuracy); `turn_rewards` (one per
turn) and `agent_rewards` (agent name -> reward) override it per turn, in that order of precedence; the
format penalty is subtracted per invalid turn. Registering a name that is taken (a built-in's) is an error.

Failures: an exception from an orchestra, a scripted role or a service costs only its episode (dropped, logged,
counted; `rollout.max_consecutive_episode_failures` in a row stop the process); raise `Fatal` where the
process cannot go on. So does an episode past its bounds (`rollout.max_episode_turns`, `max_episode_tool_calls`,
`episode_timeout_s`) or plugin code that blocks past `rollout.plugin_call_timeout_s`: plugin code runs in a
thread of the driver's (an orchestra with `driver_thread = True` runs in the driver's own, unbounded).

Renamed: `Tool`, `ToolCall`, `SandboxTool`, `AssertTool` and an orchestra's `tools` mapping are now `Service`,
`ServiceCall` (its `tool` field: `service`), `SandboxService`, `AssertService` and `services`; the old names still
work for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import warnings

import drmas.assembly  # noqa: F401  (registers the built-ins, so a plugin sees the registries every process has)
from drmas.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageBatch,
    EstimatorContext,
    LossInputs,
    LossOutput,
)
from drmas.algorithms.losses import masked_mean
from drmas.algorithms.running_stats import ALL
from drmas.config.fields import Section, help_field
from drmas.config.sandbox import SandboxConfig
from drmas.config.sections import SystemSettings, TaskSettings
from drmas.core.errors import Fatal
from drmas.core.jsonl import jsonl_records
from drmas.engines import ENGINES
from drmas.engines.base import Engine, EngineAbilities, Generation, SamplingParams
from drmas.mas import ORCHESTRAS
from drmas.models.priming import PRIMING_FORMATS, PrimingFormats
from drmas.mas.agents import AGENT_ROLES, RoleAgent, ScriptedRole, SolverAgent, TeamContext, VerifierAgent
from drmas.mas.base import (
    PENDING,
    AgentTurn,
    EpisodeGenerator,
    EpisodeOutcome,
    Orchestra,
    Reply,
    Service,
    ServiceCall,
    TurnResult,
)
from drmas.core.constraints import Constraint
from drmas.core.tool_calls import TOOL_CALL_GRAMMARS, TOOL_PARSERS, ParsedCall
from drmas.retrieval.base import Hit, Passage, Retriever
from drmas.retrieval.factory import RETRIEVERS
from drmas.tasks import TASKS
from drmas.tasks.base import Problem, Task
from drmas.tasks.grading import answers_match, extract_boxed, extract_last_number, grade_answer
from drmas.tasks.qa_grading import exact_match, extract_answer, normalize_answer, score_answer, token_f1
from drmas.tools import SandboxRequest, SandboxResult, SandboxService
from drmas.tools.asserts import AssertReport, AssertRequest, AssertService

__all__ = [
    # the orchestra protocol
    "Orchestra", "EpisodeGenerator", "AgentTurn", "ServiceCall", "Service", "TurnResult", "EpisodeOutcome", "Reply",
    "PENDING",
    # role agents
    "RoleAgent", "ScriptedRole", "TeamContext", "SolverAgent", "VerifierAgent",
    # tasks
    "Task", "Problem",
    # settings
    "SystemSettings", "TaskSettings", "Section", "help_field",
    # the registries (each `.register(name[, settings=...])` is the decorator; ENGINES' also takes traits=)
    "ORCHESTRAS", "AGENT_ROLES", "TASKS", "ENGINES", "RETRIEVERS", "TOOL_PARSERS",
    "TOOL_CALL_GRAMMARS",
    # the algorithm's parts: an advantage estimator (batch, context) -> one advantage per call, a policy loss
    # (inputs, algorithm section) -> LossOutput; ALL is the running statistics' key pooling every agent
    "ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "AdvantageBatch", "EstimatorContext", "LossInputs", "LossOutput",
    "masked_mean", "ALL",
    # tool calling: an AgentTurn's `tools` are rendered by the chat template; a parser finds a reply's calls
    "ParsedCall", "Constraint",
    # the code-execution sandbox (a service) and its settings
    "SandboxService", "SandboxRequest", "SandboxResult", "AssertService", "AssertRequest", "AssertReport",
    "SandboxConfig",
    # what a tiny test model is primed to write (`models.<id>.tiny.prime_system`): a plugin's own formats
    "PRIMING_FORMATS", "PrimingFormats",
    # engines and retrievers
    "Engine", "EngineAbilities", "Generation", "SamplingParams", "Retriever", "Hit", "Passage",
    # grading helpers: math answers (\\boxed{}, numbers, LaTeX via math-verify) and short QA answers (EM, F1)
    "extract_boxed", "extract_last_number", "answers_match", "grade_answer",
    "extract_answer", "normalize_answer", "exact_match", "token_f1", "score_answer",
    # reading a task's JSON-lines files: (where "path:LINE", line number, record), errors naming the line
    "jsonl_records",
    # an error that ends the process instead of only the episode it happened in
    "Fatal",
]

# the names these had before the orchestra's batched calls were called services (tool now means only an LLM's
# function calls): still resolved, with a DeprecationWarning, for one release
_DEPRECATED = {"Tool": "Service", "ToolCall": "ServiceCall", "SandboxTool": "SandboxService",
               "AssertTool": "AssertService"}


def __getattr__(name: str) -> object:
    new = _DEPRECATED.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"drmas.api.{name} is deprecated: use drmas.api.{new}", DeprecationWarning, stacklevel=2)
    return globals()[new]
