#!/usr/bin/env python3
"""Golden files for ctuner's T5 v1.1 encoder and SentencePiece Unigram
tokenizer, written by the real libraries (scripts/py_deps.sh t5):
sentencepiece trains a Unigram model offline on captions generated here
(T5's settings: pad 0, </s> 1, <unk> 2, no BOS, nmt_nfkc normalization),
transformers' T5TokenizerFast (extra_ids 100, as T5) converts it to
tokenizer.json, and a random tiny T5EncoderModel is saved with
save_pretrained (bf16, sharded, model.safetensors.index.json).

Writes into OUT (default tests/data/t5):
  tokenizer_2/   spiece.model, tokenizer.json, tokenizer_config.json, special_tokens_map.json
  text_encoder_2/ config.json, model-0000N-of-0000M.safetensors, model.safetensors.index.json
  tokenizer_variant.json  the same vocabulary in an older tokenizer.json layout (no charsmap,
                   Replace " {2,}" by " ", Strip, WhitespaceSplit + Metaspace)
  tok_golden.json  {"captions": [...], "ids": [[...]] (T5TokenizerFast, </s> appended,
                   no padding), "sp_differs": [i...] (captions where sentencepiece's
                   own encode + </s> gives other ids: for the record), "padded":
                   [{"caption": i, "max_length": L, "ids": [...]}] (padding="max_length",
                   truncation=True, as FluxPipeline calls it), "variant_ids": [[...]] (first
                   300 captions through tokenizer_variant.json)}
  enc_golden.safetensors  input.ids_a (B, T) I32, output.a (B, T, d) F32, same for _b;
                   the encoder's outputs (last_hidden_state, no attention_mask, as
                   FluxPipeline._get_t5_prompt_embeds) computed in float32 from the
                   bf16-stored weights.

Usage: $(scripts/py_deps.sh t5) scripts/t5_golden.py [--out DIR]
       [--seed N]   (0: the committed set; others: fresh captions, tokenizer, weights)
       --check DIR: compare DIR's golden files with freshly computed ones, write
       nothing (make interop); exit 1 on a difference.
"""
import argparse
import json
import os
import random
import sys
import tempfile

WORDS = (
    "a an the of on in at with and or photo painting drawing portrait close-up view "
    "cat dog bird horse fox owl fish tree flower forest river lake mountain city street "
    "house castle bridge car bicycle train boat robot astronaut knight wizard girl boy "
    "woman man child old young red green blue yellow purple orange black white golden "
    "silver bright dark foggy rainy sunny snowy night morning sunset sunrise sky clouds "
    "stars moon sun light shadow reflection water fire ice stone wood glass metal paper "
    "detailed realistic cinematic soft sharp blurry vintage modern futuristic ancient "
    "tiny huge small large tall wide standing sitting running flying sleeping smiling "
    "holding wearing hat coat dress shirt shoes glasses umbrella book cup table chair "
    "window door wall floor garden beach desert island field road path lantern candle "
    "highly intricate masterpiece trending style oil watercolor pencil sketch digital art "
    "unreal engine octane render bokeh depth of field wide-angle lens 35mm 85mm f/1.8 "
    "4k 8k hdr isometric pixel low-poly anime comic illustration photograph studio lighting"
).split()
UNICODE = [
    "café", "naïve", "Straße", "façade", "Ærøskøbing", "São Paulo", "Zürich", "crème brûlée",
    "東京", "北京の夜", "ラーメン", "한국어", "Москва", "Ελλάδα", "עברית", "العربية",
    "🙂", "🐱‍👤", "★", "→", "½", "①②③", "ＡＢＣ１２３", "ﬁne ﬂower", "ℌello", "x²", "™",
    "“quoted”", "‘single’", "—dash–", "…", "\u00a0nbsp", "tab\there", "line\nbreak",
    "zero\u200bwidth", "e\u0301", "Å", "Ω", "µ", "ǅ", "\u3000ideographic space",
]
PUNCT = [",", ".", "!", "?", ";", ":", "(", ")", "[", "]", "'", '"', "-", "/", "&", "#", "%", "+", "=", "*", "@"]


def caption(rng):
    n = rng.randint(1, 30)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.70:
            w = rng.choice(WORDS)
            if rng.random() < 0.15:
                w = w.capitalize()
            elif rng.random() < 0.03:
                w = w.upper()
        elif r < 0.80:
            w = str(rng.randint(0, 100000)) if rng.random() < 0.5 else "%d.%d" % (rng.randint(0, 99), rng.randint(0, 9))
        elif r < 0.92:
            w = rng.choice(UNICODE)
        else:
            w = rng.choice(PUNCT)
        out.append(w)
        if rng.random() < 0.2:
            out.append(rng.choice(PUNCT))
    sep = [" "] * 20 + ["  ", "   ", "\t", " \n "]
    s = ""
    for i, w in enumerate(out):
        s += (rng.choice(sep) if i else "") + w
    if rng.random() < 0.05:
        s = " " + s
    if rng.random() < 0.05:
        s = s + " "
    return s


def corpus(seed, n):
    rng = random.Random(seed)
    return [caption(rng) for _ in range(n)]


RANGES = [(0x20, 0x7E), (0xA0, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
          (0x1100, 0x11FF), (0x2000, 0x206F), (0x2100, 0x24FF), (0x3000, 0x30FF), (0x3099, 0x309A),
          (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFB00, 0xFB4F), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF),
          (0x1D400, 0x1D7FF), (0x1F1E6, 0x1F1FF), (0x1F300, 0x1F6FF), (0x1F3FB, 0x1F3FF), (0x200D, 0x200D)]


def random_unicode(seed, n):
    """Strings of random code points from ranges where NFKC, grapheme clusters
    and the charsmap do something (combining marks, jamo, kana voicing, emoji
    with ZWJ and modifiers, full-width, math alphanumerics, ligatures)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 30)
        out.append("".join(chr(rng.randint(*rng.choice(RANGES))) for _ in range(k)))
    return out


def test_captions(seed=0):
    caps = ["", " ", "a", "A photo of a cat", "a photo of a cat.", "  leading and trailing  ",
            "multiple     spaces", "tab\tseparated\twords", "new\nline", "UPPERCASE WORDS",
            "numbers 0 1 12 123 1234 3.14159 1,000,000", "punctuation!?!... (brackets) [x] {y}",
            "unknown chars: \u2603 \U0001F680 \u0416", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ", "ﬁ ﬂ ﬀ ①", "\u00a0\u2009\u3000",
            "e\u0301 vs \u00e9", "<unk> </s> <pad>", "▁already▁has▁metaspace", "x" * 300]
    caps += corpus(12345 + seed, 1000)
    caps += random_unicode(99 + seed, 300)
    rng = random.Random(7 + seed)
    long1 = " ".join(rng.choice(WORDS) for _ in range(700))
    caps += [long1, long1[:1500]]
    return caps


def build_tokenizer(tmp, tokdir, seed=0):
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    text = os.path.join(tmp, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        for c in corpus(1 + seed, 4000):
            f.write(c.replace("\n", " ") + "\n")
    prefix = os.path.join(tmp, "spiece")
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=prefix, model_type="unigram", vocab_size=400,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, normalization_rule_name="nmt_nfkc",
        character_coverage=0.9995, hard_vocab_limit=False, num_threads=1,
        minloglevel=2, seed_sentencepiece_size=20000)
    os.makedirs(tokdir, exist_ok=True)
    tok = T5TokenizerFast(vocab_file=prefix + ".model", extra_ids=100)
    tok.save_pretrained(tokdir)
    return tok


def tok_golden(tokdir, seed=0):
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    tok = T5TokenizerFast.from_pretrained(tokdir)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(tokdir, "spiece.model"))
    caps = test_captions(seed)
    ids = [tok(c).input_ids for c in caps]
    sp_differs = [i for i, c in enumerate(caps) if sp.encode(c) + [1] != ids[i]]
    padded = []
    for i in list(range(0, 60)) + [len(caps) - 2, len(caps) - 1]:
        for L in (16, 77):
            padded.append({"caption": i, "max_length": L,
                           "ids": tok(caps[i], padding="max_length", max_length=L, truncation=True).input_ids})
    for i in (len(caps) - 2, len(caps) - 1):
        for L in (256, 512):
            padded.append({"caption": i, "max_length": L,
                           "ids": tok(caps[i], padding="max_length", max_length=L, truncation=True).input_ids})
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers

    var = Tokenizer.from_file(os.path.join(tokdir, "tokenizer.json"))
    var.normalizer = normalizers.Sequence([normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip(left=True, right=True)])
    var.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")])
    var_path = os.path.join(os.path.dirname(tokdir), "tokenizer_variant.json")
    if not os.path.exists(var_path):
        var.save(var_path)
    var = Tokenizer.from_file(var_path)
    variant_ids = [var.encode(c).ids for c in caps[:300]]
    return {"captions": caps, "ids": ids, "sp_differs": sp_differs, "padded": padded, "variant_ids": variant_ids}


def build_encoder(encdir, vocab, seed=0):
    import torch
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=vocab, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=32, relative_attention_max_distance=128,
                   feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0,
                   initializer_factor=1.0, tie_word_embeddings=False, is_encoder_decoder=False,
                   use_cache=False)
    m = T5EncoderModel(cfg).eval()
    # HF's init leaves layer norms at 1 and draws the rest with small stds; make
    # every tensor matter at this size (norm weights away from 1, larger q/k).
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "layer_norm" in n:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "relative_attention_bias" in n:
                p.copy_(torch.randn_like(p))
            elif n == "shared.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
    m = m.to(torch.bfloat16)
    m.save_pretrained(encdir, safe_serialization=True, max_shard_size="120KB")
    return T5EncoderModel.from_pretrained(encdir, torch_dtype=torch.float32).eval()


def enc_golden(model, gold):
    import torch

    caps = gold["captions"]
    a = [p["ids"] for p in gold["padded"] if p["max_length"] == 16][:3]
    ids_a = torch.tensor(a, dtype=torch.int64)
    g = torch.Generator().manual_seed(3)
    ids_b = torch.randint(0, model.config.vocab_size, (1, 300), generator=g)
    out = {}
    with torch.no_grad():
        for k, ids in (("a", ids_a), ("b", ids_b)):
            out["input.ids_" + k] = ids.to(torch.int32).contiguous()
            out["output." + k] = model(ids, output_hidden_states=False)[0].float().contiguous()
    del caps
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-600, 601, dtype=torch.long)
    for nb, md in ((32, 128), (64, 100), (16, 20)):
        b = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=nb, max_distance=md)
        out["buckets.%d_%d" % (nb, md)] = b.to(torch.int32).contiguous()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/t5")
    ap.add_argument("--seed", type=int, default=0,
                    help="other captions, tokenizer corpus and weights (make interop's fresh set)")
    ap.add_argument("--check", default=None, help="compare this directory's goldens, write nothing")
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file, save_file

    if args.check:
        d = args.check
        gold = tok_golden(os.path.join(d, "tokenizer_2"))
        with open(os.path.join(d, "tok_golden.json"), encoding="utf-8") as f:
            old = json.load(f)
        bad = 0
        for k in ("captions", "ids", "sp_differs", "padded", "variant_ids"):
            if gold[k] != old[k]:
                print("t5_golden: %s differs from the committed golden" % k)
                bad = 1
        from transformers import T5EncoderModel

        m = T5EncoderModel.from_pretrained(os.path.join(d, "text_encoder_2"), torch_dtype=torch.float32).eval()
        ref = load_file(os.path.join(d, "enc_golden.safetensors"))
        with torch.no_grad():
            for k in ("a", "b"):
                y = m(ref["input.ids_" + k].long())[0]
                diff = (y - ref["output." + k]).abs().max().item()
                print("t5_golden: encoder output %s max abs diff %.3g" % (k, diff))
                bad |= diff > 1e-5
        print("t5_golden: %s" % ("DIFFERS" if bad else "ok: tokenizer ids and encoder outputs reproduce"))
        sys.exit(1 if bad else 0)

    tokdir = os.path.join(args.out, "tokenizer_2")
    encdir = os.path.join(args.out, "text_encoder_2")
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_tokenizer(tmp, tokdir, args.seed)
    gold = tok_golden(tokdir, args.seed)
    with open(os.path.join(args.out, "tok_golden.json"), "w", encoding="utf-8") as f:
        json.dump(gold, f, ensure_ascii=True, separators=(",", ":"))
    model = build_encoder(encdir, len(tok), args.seed)
    save_file(enc_golden(model, gold), os.path.join(args.out, "enc_golden.safetensors"))
    ndiff = len(gold["sp_differs"])
    print("t5_golden: %d captions, vocab %d; T5TokenizerFast and sentencepiece differ on %d" % (
        len(gold["captions"]), len(tok), ndiff))


if __name__ == "__main__":
    main()
