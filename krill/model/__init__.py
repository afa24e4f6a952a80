"""Models for Krill: loading, building, sharding, publishing, generating and evaluating.

Module map (each module's docstring states its design and public API):
    tokenizer   the default character tokenizer (HF fast tokenizer built with `tokenizers`)
    build       tiny Llama models from a spec; `load_model(dir)` for any local HF causal LM
    base        the default base model: seeded init + supervised warm start, cached by recipe
    shards      contiguous layer-block sharding plan; shard tensors <-> safetensors bytes
    manifest    the typed, canonical-JSON version manifest
    architecture  a manifest's config checked against its tensors (on `meta`) before a model is built
    publish     model versions in a content store: publish, fetch (verified), assemble
    generate    batched KV-cache generation, greedy or seeded sampling
    evaluate    greedy accuracy / pass@k / mean length on a task's eval split

Heavy libraries (torch, transformers) are imported inside functions, so importing this
package is cheap.
"""
