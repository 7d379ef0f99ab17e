"""The slim FSDP2 trainer that streams what `tokenmill prepare` wrote.

    tokenmill train --data OUT --run RUN [--config train.yaml] [--set key=value ...]
    torchrun --nproc_per_node 8 --no-python -- tokenmill train --data OUT --run RUN ...

(The ``--`` keeps torchrun's own argument parser from reading ``--run`` as its ``--run-path``.)
Rerunning the same command resumes from the newest complete checkpoint in RUN.

One module per concern, in the order a run uses them:

    config.py      the validated config (pydantic; YAML + --set), model presets
    data.py        manifest + checksums, mmapped token streams, packed windows, sample order,
                   rank/worker slices, mixtures, validation batches
    model.py       Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA via SDPA); no parallelism
    parallel.py    process group + device mesh; meta build -> activation checkpointing ->
                   compile -> fully_shard -> materialise
    train.py       the loop: micro-steps, clip, AdamW, schedule, non-finite skips, eval, saves
    checkpoint.py  DCP checkpoints written to a temp folder, marked COMPLETE, renamed
    metrics.py     metrics.jsonl, TensorBoard, MFU, the console line
    export.py      RUN/hf: a transformers-loadable LlamaForCausalLM

Assumptions: the prepared outputs and RUN are on a filesystem every rank sees (rank 0
verifies the shard checksums and renames checkpoint folders for all).
"""
