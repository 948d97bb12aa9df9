"""Model clients behind one interface (`Client`): OpenAI-compatible HTTP, local transformers
through `trex.compile`, and replay of stored predictions.

The transformers client imports torch; import it from `trex.workloads.or_eval.clients.local`
only when it is used.
"""

from trex.workloads.or_eval.clients.base import Client, Completion, GenerationRequest, sample_key
from trex.workloads.or_eval.clients.openai import OpenAIClient
from trex.workloads.or_eval.clients.replay import ReplayClient

__all__ = ["Client", "Completion", "GenerationRequest", "OpenAIClient", "ReplayClient", "sample_key"]
