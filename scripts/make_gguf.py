#!/usr/bin/env python3
"""Writes a random-weight llama-architecture GGUF that llama-server can run.

The text it generates is gibberish; the compute, the KV cache and the server's
metrics are real. Weights come from a seeded generator, so every run writes the
same bytes.

usage: make_gguf.py OUT.gguf [--embd 128] [--layers 2] [--heads 4]
                             [--ff 256] [--ctx 4096] [--seed 0]
"""
import argparse
import string

import gguf
import numpy as np

WORD = "\u2581"  # SentencePiece's word-boundary marker


def vocabulary():
    """A SentencePiece-style vocabulary: specials, 256 byte tokens, pieces."""
    kinds = gguf.TokenType
    tokens = [("<unk>", kinds.UNKNOWN), ("<s>", kinds.CONTROL), ("</s>", kinds.CONTROL)]
    tokens += [(f"<0x{b:02X}>", kinds.BYTE) for b in range(256)]
    letters = string.ascii_letters
    pieces = [WORD] + list(letters + string.digits + ".,!?;:'\"-()[]{}<>/|_=+*&%$#@")
    pieces += [WORD + c for c in letters]
    words = ["the", "and", "ing", "er", "on", "in", "at", "es", "re", "an", "he",
             "is", "it", "to", "of", "or", "en", "ed", "nd", "ou", "hello", "world",
             "user", "assistant", "system", "im", "start", "end"]
    pieces += words + [WORD + w for w in words]
    seen = set()
    for piece in pieces:
        if piece not in seen:
            seen.add(piece)
            tokens.append((piece, kinds.NORMAL))
    texts = [t.encode("utf-8") for t, _ in tokens]
    # Plain pieces score by order (earlier merges win); specials score 0.
    scores = [0.0 if kind != kinds.NORMAL else -0.01 * i for i, (_, kind) in enumerate(tokens)]
    types = [int(kind) for _, kind in tokens]
    return texts, scores, types


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--embd", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff", type=int, default=256)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    texts, scores, types = vocabulary()
    embd, heads = args.embd, args.heads
    head_dim = embd // heads
    rng = np.random.default_rng(args.seed)

    def weights(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n):
        return np.ones(n, np.float32)

    out = gguf.GGUFWriter(args.out, "llama")
    out.add_name(f"random-llama-{args.layers}L-{embd}d")
    out.add_context_length(args.ctx)
    out.add_embedding_length(embd)
    out.add_block_count(args.layers)
    out.add_feed_forward_length(args.ff)
    out.add_head_count(heads)
    out.add_head_count_kv(heads)
    out.add_rope_dimension_count(head_dim)
    out.add_layer_norm_rms_eps(1e-5)
    out.add_rope_freq_base(10000.0)
    out.add_vocab_size(len(texts))
    out.add_file_type(gguf.LlamaFileType.ALL_F32)
    out.add_tokenizer_model("llama")
    out.add_token_list(texts)
    out.add_token_scores(scores)
    out.add_token_types(types)
    out.add_unk_token_id(0)
    out.add_bos_token_id(1)
    out.add_eos_token_id(2)
    out.add_add_bos_token(True)
    out.add_add_eos_token(False)
    # A ChatML-like template, so /v1/chat/completions can render messages.
    out.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    # numpy shapes are (out, in); the writer stores GGUF's reversed order.
    out.add_tensor("token_embd.weight", weights(len(texts), embd))
    for layer in range(args.layers):
        block = f"blk.{layer}."
        out.add_tensor(block + "attn_norm.weight", ones(embd))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out.add_tensor(block + name + ".weight", weights(embd, embd))
        out.add_tensor(block + "ffn_norm.weight", ones(embd))
        out.add_tensor(block + "ffn_gate.weight", weights(args.ff, embd))
        out.add_tensor(block + "ffn_up.weight", weights(args.ff, embd))
        out.add_tensor(block + "ffn_down.weight", weights(embd, args.ff))
    out.add_tensor("output_norm.weight", ones(embd))
    out.add_tensor("output.weight", weights(len(texts), embd))

    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    print(f"wrote {args.out}: vocab {len(texts)}, {args.layers} layers of {embd}, {heads} heads")


if __name__ == "__main__":
    main()
