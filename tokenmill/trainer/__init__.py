"""The slim FSDP2 trainer that streams what `tokenmill prepare` wrote.

    tokenmill train --data OUT --run-dir RUN [--config train.yaml] [--set key=value ...]
    torchrun --nproc_per_node 8 --no-python tokenmill train --data OUT --run-dir RUN ...

(``--run`` is an alias, but not under torchrun: its parser reads ``--run`` as ``--run-path``.)
Rerunning the same command resumes from the newest complete checkpoint in RUN.

One module per concern, in the order a run uses them:

    train_config.py  the validated config (pydantic; YAML + --set), model presets
    windows.py     manifest + checksums, mmapped token streams, packed windows, sample order,
                   rank/worker slices, mixtures, validation batches
    model.py       Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA via SDPA, document masks via
                   FlexAttention on GPU); no parallelism
    parallel.py    process group + device mesh; meta build -> activation checkpointing ->
                   compile -> fully_shard -> materialise
    preflight.py   refusals before training: run folder, checksums (a slice per rank), memory,
                   the RUN's tokenizer and model shape
    train.py       the loop (Trainer): set up, train_step (micro-steps via forward_backward_step,
                   clip, non-finite skips), then log/eval and checkpoint decisions, export
    forward.py     the forward pass under the run's precision, and the summed token loss
    optimizer.py   AdamW, its schedule and parameter groups, a step skipped on the device
    stop.py        SIGTERM: a checkpoint at the end of the step, a second one ends the process
    checkpoint.py  DCP checkpoints written to a temp folder, marked COMPLETE, renamed
    metrics.py     metrics.jsonl, TensorBoard, MFU, memory, the console line, the end-of-run summary
    hf_export.py   RUN/hf: a transformers-loadable LlamaForCausalLM
    evaluation.py  validation loss and bits per byte (tokenizer-independent)
    compare.py     `tokenmill compare`: matched proxy runs per prepared output, scored in bpb;
                   compare_html.py renders its page

Assumptions: the prepared outputs and RUN are on a filesystem every rank sees (each rank
verifies its slice of the shard checksums; rank 0 renames checkpoint folders for all).
"""
