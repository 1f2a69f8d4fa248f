"""Services an orchestra's episodes call between agent turns (`drmas.mas.base.Service`), batched by the driver:
the sandbox for model-written code. (The package keeps its name `tools`; an LLM's tools are `drmas.core.tool_calls`.)

`SandboxService` runs model-written Python under operating-system limits (docs/sandbox.md); `AssertService` runs
a solution against assert statements on it, the check a coder/tester system needs.
"""

from drmas.tools.outcome import STATUSES, SandboxRequest, SandboxResult
from drmas.tools.sandbox import SandboxService, SandboxUnavailable

__all__ = ["STATUSES", "SandboxRequest", "SandboxResult", "SandboxService", "SandboxUnavailable"]
