"""trex.runtime: plans executed on torch.distributed.

    trex train --model tiny-qwen3-moe --plan "ep=2,zero=1" --nproc 2 --steps 3 --json

Modules, in the order a run meets them:
  run_plan          parse a plan string, refuse what cannot run (with the numbers) before any process starts
  launcher          start N local ranks with torch.distributed's elastic launcher (or run under torchrun); fault reports
  trainer           one rank's run: build, apply the plan, train, measure, checkpoint
  mesh              the DeviceMeshes of a plan: ("dp", "tp") and the expert mesh ("edp", "ep")
  parallelize       apply a plan to a model: tp, ep, ZeRO-0/1/2 or FSDP2 (ZeRO-3)
  tensor_parallel   TP + sequence parallelism with DTensor styles, vocab-parallel embedding and loss
  expert_parallel   EP as graph nodes: `trex.ep_counts`, `ep_exchange` + wait (dispatch, combine), `ep_experts_local`;
  data_parallel     gradient reduction over each parameter's replica group; ZeRO-0/1/2 AdamW
  data              seed-determined global batches (synthetic or .jsonl), replica rows, micro-batches
  checkpoint        atomic DCP checkpoints that resume exactly, under any plan
  memory_accounting saved-activation bytes per micro-batch
  training_layout   the dtypes a rank stores (fp32 parameters, gradients, states; autocast compute), priced as run
  prediction        the cost model's step time and memory for the run
  cli               the `trex train` command
"""
