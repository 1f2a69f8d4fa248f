"""Tools an orchestra's episodes call between agent turns (`drmas.mas.base.Tool`), batched by the driver.

`SandboxTool` runs model-written Python under operating-system limits (docs/sandbox.md); `AssertTool` runs
a solution against assert statements on it, the check a coder/tester system needs.
"""

from drmas.tools.outcome import STATUSES, SandboxRequest, SandboxResult
from drmas.tools.sandbox import SandboxTool, SandboxUnavailable

__all__ = ["STATUSES", "SandboxRequest", "SandboxResult", "SandboxTool", "SandboxUnavailable"]
