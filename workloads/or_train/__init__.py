"""The OR post-training loop: CPT then SFT on `trex data synth`'s output, evaluated with `trex eval`.

| module | what it holds |
| --- | --- |
| `tokenizer` | the built-in byte tokenizer (a real transformers tokenizer with a chat template) and loading one |
| `samples` | reading and encoding sft/cpt JSONL; assistant-only labels; rejected lines counted and kept |
| `packing` | rows of samples (packed, document-isolated, or one per row) and the check that a model isolates |
| `source` | the batch source each rank builds from the job (deterministic: any plan, any resume) |
| `cli` | `trex train sft` and `trex train cpt` |
| `pipeline` | `trex train pipeline`: CPT -> SFT -> eval in one command |
| `dry_run` | `--dry-run`: plan, step time, MFU, time for the data and memory per device, no weights |

Training itself is trex's runtime (`trex.runtime`: plans, ranks, DCP checkpoints); this package only
supplies the data, the recipe (schedule, clipping, export) and the commands.
"""
