"""Writes a tiny llama-architecture GGUF with random weights (issue 51): 2 layers, 64 wide,
the tokenizer copied from one of llama.cpp's vocabulary-only GGUFs (models/ggml-vocab-*.gguf).
Its output text is random; it exists to exercise a real llama-server (KV reuse, slots,
metrics). Usage: tiny_model.py VOCAB.gguf OUT.gguf (build.sh runs it with PyPI gguf pinned)."""

import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

EMBD, LAYERS, HEADS, FF, CTX = 64, 2, 4, 128, 4096


def main(vocab_path: str, out_path: str) -> None:
    vocab = GGUFReader(vocab_path)
    w = GGUFWriter(out_path, "llama")
    w.add_name("ailb-tiny-llama")
    w.add_context_length(CTX)
    w.add_embedding_length(EMBD)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(EMBD // HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)  # mostly F16
    n_vocab = 0
    for name, field in vocab.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(name, value, field.types[0], sub_type=sub)
    if n_vocab == 0:
        sys.exit(f"tiny_model: no tokenizer.ggml.tokens in {vocab_path}")

    rng = np.random.default_rng(51)

    def rand(*shape: int, dtype=np.float32) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(dtype)

    # Shapes are numpy order (rows = output features); the output matrix is tied to token_embd.
    w.add_tensor("token_embd.weight", rand(n_vocab, EMBD, dtype=np.float16),
                 raw_dtype=GGMLQuantizationType.F16)
    w.add_tensor("output_norm.weight", np.ones(EMBD, dtype=np.float32))
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(EMBD, dtype=np.float32))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + t + ".weight", rand(EMBD, EMBD))
        w.add_tensor(p + "ffn_norm.weight", np.ones(EMBD, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(FF, EMBD))
        w.add_tensor(p + "ffn_up.weight", rand(FF, EMBD))
        w.add_tensor(p + "ffn_down.weight", rand(EMBD, FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: tiny_model.py VOCAB.gguf OUT.gguf")
    main(sys.argv[1], sys.argv[2])
