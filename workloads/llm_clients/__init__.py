"""LLM clients shared by the OR workloads (the evaluator's model under test, the data pipeline's
teachers and judges): one interface (`Client`: requests in, completions out), an OpenAI-compatible
HTTP client and a local transformers client.

The transformers client imports torch; import it from `trex.workloads.llm_clients.local`.
"""

from trex.workloads.llm_clients.base import Client, Completion, GenerationRequest, sample_key
from trex.workloads.llm_clients.errors import ClientError
from trex.workloads.llm_clients.openai import OpenAIClient

__all__ = ["Client", "ClientError", "Completion", "GenerationRequest", "OpenAIClient", "sample_key"]
