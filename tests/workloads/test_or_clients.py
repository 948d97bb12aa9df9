"""Model clients: OpenAI-compatible HTTP against a real local server, replay files, local transformers."""

from __future__ import annotations

import json
import socket
import time

import pytest

from trex.workloads.llm_clients import GenerationRequest, OpenAIClient
from trex.workloads.or_eval import Item, Objective
from trex.workloads.or_eval.errors import ClientError, DataFormatError
from trex.workloads.or_eval.replay_client import ReplayClient


def requests_for(count: int) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            item=Item(id=str(i), question=f"q{i}", answer=Objective(i), category="c", line=i + 1),
            sample=0,
            prompt=f"prompt {i}",
        )
        for i in range(count)
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- OpenAI-compatible ------------------------------------------------------------------------


def test_chat_completions_return_one_completion_per_request(fake_server):
    server = fake_server()
    client = OpenAIClient(server.url, "tiny", temperature=0.3, max_tokens=99, concurrency=2)
    completions = {c.key: c.text for c in client.generate(requests_for(5))}
    assert completions == {f"{i}#0": f"echo: prompt {i}" for i in range(5)}
    request = server.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert (request["model"], request["temperature"], request["max_tokens"]) == ("tiny", 0.3, 99)
    assert request["messages"][-1]["role"] == "user"


def test_completions_api_sends_the_prompt_and_base_url_may_end_in_v1(fake_server):
    server = fake_server()
    client = OpenAIClient(server.url + "/v1/", "tiny", api="completions")
    assert [c.text for c in client.generate(requests_for(1))] == ["echo: prompt 0"]
    assert server.requests[0]["path"] == "/v1/completions" and server.requests[0]["prompt"] == "prompt 0"


def test_server_errors_are_retried_with_backoff(fake_server):
    server = fake_server(script=[503, 500])
    client = OpenAIClient(server.url, "tiny", backoff_s=0.1, max_retries=3)
    started = time.monotonic()
    assert [c.text for c in client.generate(requests_for(1))] == ["echo: prompt 0"]
    assert client.retries == 2
    assert time.monotonic() - started >= 0.05 + 0.1  # jittered backoff: 0.05-0.1 s, then 0.1-0.2 s
    assert len(server.requests) == 3


def test_retry_after_is_honoured(fake_server):
    server = fake_server(script=[429], retry_after=0.5)
    client = OpenAIClient(server.url, "tiny", backoff_s=0.01)
    started = time.monotonic()
    list(client.generate(requests_for(1)))
    assert time.monotonic() - started >= 0.5


def test_a_request_that_times_out_is_retried(fake_server):
    server = fake_server(script=[3.0])
    client = OpenAIClient(server.url, "tiny", timeout_s=0.5, backoff_s=0.01)
    started = time.monotonic()
    assert [c.text for c in client.generate(requests_for(1))] == ["echo: prompt 0"]
    assert client.retries == 1
    assert time.monotonic() - started < 2.5


def test_exhausted_retries_fail_with_the_url_and_last_error(fake_server):
    server = fake_server(script=[503] * 10)
    client = OpenAIClient(server.url, "tiny", backoff_s=0.01, max_retries=2)
    with pytest.raises(ClientError, match=rf"{server.url}/v1/chat/completions failed after 3 attempts: HTTP 503"):
        list(client.generate(requests_for(1)))


def test_a_client_error_status_fails_at_once(fake_server):
    server = fake_server(script=[400])
    client = OpenAIClient(server.url, "tiny", backoff_s=0.01)
    with pytest.raises(ClientError, match="refused the request: HTTP 400"):
        list(client.generate(requests_for(1)))
    assert len(server.requests) == 1


def test_a_response_that_is_not_a_completion_is_an_error(fake_server):
    server = fake_server(script=["garbage"])
    with pytest.raises(ClientError, match="not a completion"):
        list(OpenAIClient(server.url, "tiny").generate(requests_for(1)))


def test_requests_run_concurrently_up_to_the_limit(fake_server):
    server = fake_server(delay=0.2)
    client = OpenAIClient(server.url, "tiny", concurrency=4)
    assert len(list(client.generate(requests_for(12)))) == 12
    assert server.max_in_flight == 4  # the speed this buys is measured in bench/, not asserted here


def test_unreachable_server_fails_fast_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    # with a 10 s backoff a single retry would wait >= 5 s; failing fast means not retrying at all
    client = OpenAIClient(url, "tiny", max_retries=5, backoff_s=10.0)
    started = time.monotonic()
    with pytest.raises(ClientError, match=rf"cannot reach the model server at {url}/v1/models: .*refused"):
        list(client.generate(requests_for(3)))
    assert client.retries == 0
    assert time.monotonic() - started < 5


def test_base_url_must_be_http():
    with pytest.raises(ClientError, match="must start with http"):
        OpenAIClient("localhost:8000", "tiny")


# -- replay -----------------------------------------------------------------------------------


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_orlm_records_replay_their_program_and_carry_the_benchmark(tmp_path):
    path = write_jsonl(
        tmp_path / "x.executed.jsonl",
        [
            {
                "en_question": "Q one",
                "en_answer": "3",
                "en_math_model_coptpy_code": "text",
                "to_run_script": "print(3)",
            },
            {
                "en_question": "Q two",
                "en_answer": "No Best Solution",
                "en_math_model_coptpy_code": "text",
                "to_run_script": "print(0)",
            },
        ],
    )
    client = ReplayClient(path)
    benchmark = client.as_benchmark()
    assert benchmark.name == "x"
    assert [item.question for item in benchmark.items] == ["Q one", "Q two"]
    completion = next(client.generate([GenerationRequest(benchmark.items[0], 0, "p")]))
    assert (completion.program, completion.origin) == ("print(3)", "replay:to_run_script")


def test_replay_matches_records_to_benchmark_items_by_question_text(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"question": "Maximize   profit\n now", "output": "a"},
            {"question": "something else", "output": "b"},
            {"question": "Maximize profit now", "output": "c"},
        ],
    )
    item = Item(id="7", question="Maximize profit now", answer=Objective(1), category="c", line=1)
    from trex.workloads.or_eval import Benchmark

    client = ReplayClient(path)
    client.match(Benchmark(name="b", path="b", sha256="0" * 64, items=(item,)))
    assert client.unmatched == [2]
    assert client.samples_per_item() == 2
    texts = [c.text for c in client.generate([GenerationRequest(item, j, "p") for j in range(3)])]
    assert texts == ["a", "c", None]  # the third sample has no record


def test_replay_refuses_conflicting_answers_for_one_question(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"question": "q", "answer": 1, "output": "a"}, {"question": "q", "answer": 2, "output": "b"}],
    )
    with pytest.raises(
        DataFormatError, match=r"p.jsonl:2: field 'answer': differs from the same question's answer at line 1"
    ):
        ReplayClient(path).as_benchmark()


def test_replay_names_the_line_of_a_non_text_output(tmp_path):
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [{"question": "q", "answer": 1, "output": "a"}, {"question": "r", "answer": 1, "output": 5}],
    )
    client = ReplayClient(path)
    benchmark = client.as_benchmark()
    with pytest.raises(DataFormatError, match=r"p.jsonl:2: field 'output': expected text, found int"):
        list(client.generate([GenerationRequest(item, 0, "p") for item in benchmark.items]))


def test_replay_without_any_prediction_field_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "q", "answer": 1}])
    with pytest.raises(DataFormatError, match=r"p.jsonl:1: no program or output field"):
        ReplayClient(path)


# -- local transformers through trex.compile --------------------------------------------------


@pytest.fixture(scope="module")
def tiny_moe():
    """A random-init two-layer Qwen3-MoE and a character tokenizer, built here (nothing downloaded)."""
    torch = pytest.importorskip("torch")
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from workload_helpers import CHARACTER_VOCAB, character_tokenizer

    words = CHARACTER_VOCAB
    tokenizer = character_tokenizer(words)
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(words),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )
    return Qwen3MoeForCausalLM(config).eval(), tokenizer


PROMPTS = ["minimize cost", "x"]  # different lengths: the batch is left-padded


def reference_tokens(model, tokenizer, prompt: str, new_tokens: int) -> list[int]:
    tokenizer.padding_side = "left"
    encoded = tokenizer([prompt], return_tensors="pt")
    generated = model.generate(**encoded, max_new_tokens=new_tokens, do_sample=False)
    return generated[0, encoded["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_decoding_matches_transformers_generate(tiny_moe, use_cache):
    from trex.workloads.llm_clients.local import TransformersClient

    model, tokenizer = tiny_moe
    client = TransformersClient(
        "tiny", compile=False, model=model, tokenizer=tokenizer, max_new_tokens=10, use_cache=use_cache
    )
    assert client.generate_tokens(PROMPTS) == [reference_tokens(model, tokenizer, p, 10) for p in PROMPTS]


def test_generation_through_trex_compile_matches_eager(tiny_moe):
    import trex
    from trex.workloads.llm_clients.local import TransformersClient

    model, tokenizer = tiny_moe
    compiled = TransformersClient("tiny", compile=True, model=model, tokenizer=tokenizer, max_new_tokens=6)
    assert isinstance(compiled.forward, trex.CompiledModule)
    eager = TransformersClient("tiny", compile=False, model=model, tokenizer=tokenizer, max_new_tokens=6)
    assert compiled.generate_tokens(PROMPTS) == eager.generate_tokens(PROMPTS)


def test_long_compiled_generation_uses_few_graphs_and_matches_eager(tiny_moe):
    """A decode of 34 tokens is 34 different lengths; compiled decoding pads them to power-of-two buckets."""
    import torch

    from trex.workloads.llm_clients.local import TransformersClient

    model, tokenizer = tiny_moe
    torch._dynamo.reset()
    compiled = TransformersClient("tiny", compile=True, model=model, tokenizer=tokenizer, max_new_tokens=34)
    eager = TransformersClient("tiny", compile=False, model=model, tokenizer=tokenizer, max_new_tokens=34)
    tokens = compiled.generate_tokens(PROMPTS)
    assert tokens == eager.generate_tokens(PROMPTS)
    assert max(len(t) for t in tokens) > 32  # crossed a bucket boundary
    assert len(compiled.forward.trex.graphs) <= 3


def test_sampling_is_reproducible_from_the_seed(tiny_moe):
    from trex.workloads.llm_clients.local import TransformersClient

    model, tokenizer = tiny_moe

    def sample(seed: int) -> list[list[int]]:
        client = TransformersClient(
            "tiny",
            compile=False,
            model=model,
            tokenizer=tokenizer,
            max_new_tokens=12,
            temperature=1.5,
            top_p=0.9,
            seed=seed,
        )
        return client.generate_tokens(PROMPTS)

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_a_missing_model_directory_is_a_client_error(tmp_path):
    from trex.workloads.llm_clients.local import TransformersClient

    with pytest.raises(ClientError, match="is not a directory"):
        TransformersClient(tmp_path / "nope")
