"""Serving large models on heterogeneous clusters (`trex serve`).

Following "High-Throughput LLM inference on Heterogeneous Clusters" (arXiv 2504.15303): per machine
type choose a tensor-parallel degree and an instance count from a model of memory (weights + KV
cache) and throughput (prefill compute-bound, decode bandwidth-bound, fitted by least squares), then
route each request with every instance's capacity and KV-cache use in mind.

Modules, in the order a request meets them:

* `cluster_spec`   - cluster TOML files: machine types from the cost model's device catalog.
* `kv_cache`       - KV-cache bytes per token from the model spec (GQA, MLA latents, V4 compressed KV).
* `instance_model` - one instance (model, device, TP degree): memory feasibility and analytic step latency.
* `latency_fit`    - prefill/decode step latency as least-squares fits to sampled or measured steps.
* `workload`       - requests: ShareGPT-like lengths, Poisson arrivals, JSONL and Azure/Splitwise traces.
* `capacity`       - steady-state throughput, TTFT and TPOT of one instance at a batch size.
* `deployment`     - exhaustive per-machine-type search under SLOs; runners-up with the reason they lose.
* `schedulers`     - round_robin, random, jsq, token_jsq, po2, weighted_rr and trex behind one interface.
* `simulator`      - discrete-event simulation with continuous batching and KV-cache limits.
* `metrics`        - throughput, goodput, TTFT/TPOT percentiles, utilisation and imbalance.
* `profiling`      - measure a real local instance (a tiny transformers model on CPU) and fit it.
* `worker`         - an OpenAI-compatible CPU worker serving a tiny random-init model (tests, benches).
* `http`           - the small HTTP/1.1 layer (asyncio streams) the worker and router share.
* `router`         - the live OpenAI-compatible router in front of real workers, using the schedulers.
* `cli`            - `trex serve profile | plan | simulate | route | worker`.
"""
