"""trex: a compiler-style graph optimization layer for full-parameter post-training of MoE LLMs.

    compiled = trex.compile(model)                     # capture, passes, lowering
    loss = compiled(input_ids=ids, labels=ids).loss    # trains like the original
    loss.backward(); optimizer.step()

See README.md and ARCHITECTURE.md for the path of a model through the compiler.
"""

from trex import ops  # noqa: F401 - registers torch.ops.trex before anything is captured
from trex.api import CompiledModule, CompileSession, TrexFallbackWarning, compile
from trex.backends import Backend, available_backends, get_backend, register_backend
from trex.errors import BackendError, CaptureError, PassError, TrexError, UnknownNameError
from trex.pass_manager import Decision, Pass, PassContext, PassResult
from trex.targets import TARGETS, Target

__version__ = "0.1.0"

__all__ = [
    "TARGETS",
    "Backend",
    "BackendError",
    "CaptureError",
    "CompileSession",
    "CompiledModule",
    "Decision",
    "Pass",
    "PassContext",
    "PassError",
    "PassResult",
    "Target",
    "TrexError",
    "TrexFallbackWarning",
    "UnknownNameError",
    "__version__",
    "available_backends",
    "compile",
    "get_backend",
    "register_backend",
]
