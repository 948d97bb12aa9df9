"""Pipeline parallelism: the plan's stage split executed by torch.distributed.pipelining.

split       which layers sit in which chunk, which rank runs each chunk (the plan's split, checked)
stages      the model cut into chunk modules that keep the unsharded model's parameter names
schedules   GPipe, 1F1B, interleaved 1F1B, ZB-V, DualPipeV on the engine, and their constraints
timing      per-action timestamps of a rank's pipeline work
bubble      the measured bubble and the cost model's prediction for the schedule
trainer     one rank's training run with pp > 1 (`PipelineTrainer`, chosen by runtime.trainer)
"""
