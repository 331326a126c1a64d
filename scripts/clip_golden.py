#!/usr/bin/env python3
"""Goldens for ctuner's CLIP text encoder and tokenizer, from transformers
itself (4.46.3 via scripts/py_deps.sh t5): FLUX's text_encoder / tokenizer as
FluxPipeline._get_clip_prompt_embeds calls them.

Writes into OUT (default tests/data/clip):
  tokenizer/        CLIPTokenizer.save_pretrained over tests/data/bpe's
                    vocabulary (2,014 ids), FLUX's tokenizer_config settings
  text_encoder/     random CLIPTextModel: quick_gelu, eos_token_id 2 (the
                    legacy pooling rule, as FLUX.1's config), F16, one file
  text_encoder_gelu/  another: gelu, eos_token_id = <|endoftext|>, BF16,
                    sharded with model.safetensors.index.json
  tok_golden.json   captions and the ids of CLIPTokenizer (slow, no ftfy: the
                    path FluxPipeline takes when ftfy is not installed) and of
                    CLIPTokenizerFast, unpadded; FluxPipeline's padded ids
                    (max_length 77) for some
  enc_golden.safetensors  per model: input ids (I32), last_hidden_state and
                    pooler_output (F32) of the model loaded in float32

  --check DIR   re-derive everything from DIR's tokenizer and models with the
                installed libraries and compare with DIR's goldens (ids equal,
                outputs within 1e-5 relative), exit 1 on a difference
  --seed N      other weights and another caption sample (make interop: 1)

Usage: $(scripts/py_deps.sh t5) scripts/clip_golden.py [--out DIR] [--seed N]
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTokenizer,
    CLIPTokenizerFast,
)

HERE = os.path.dirname(os.path.abspath(__file__))
BPE = os.path.join(HERE, "..", "tests", "data", "bpe")

WORDS = (
    "a the of in on at with and photo painting portrait of cat dog red blue green large small "
    "center background white black tree house river mountain sky sunset city street night "
    "woman man child running sitting under over beside golden light shadow"
).split()
UNI = [
    "café", "naïve", "Crème Brûlée", "ÉCOLE", "Ångström", "Straße", "İstanbul", "ΣΟΦΙΑ",
    "ΟΔΟΣ", "Москва", "Привет мир", "日本語の文章", "中文字符测试", "한국어 문장", "東京タワー",
    "😀 smile", "🐱‍👤", "👍🏽", "🇫🇷 flag", "e\u0301", "A\u030a", "ﬁne ﬂow", "ＦＵＬＬ ｗｉｄｔｈ",
    "①②③", "½ cup", "x²", "٣ ٤", "१२३", "Ⅻ", "〇", "\u00a0nbsp\u00a0", "tab\there",
    "new\nline", "cr\r\nlf", "\u2028sep", "zero\u200bwidth", "soft\u00adhyphen", "ctl\x01\x02x",
    "del\x7fx", "\ufeffbom", "\ufffdreplacement", "x\x0by\x0cz", "\x1cfs\x1d", "nel\x85x",
    "em\u2003space", "ideo\u3000space", "dash — dash", "quote “curly” ‘single’", "€100",
    "£5 ¥3", "©®™", "§¶", "¿qué?", "¡hola!", "ñandú", "Ça va", "ǅ ǈ", "ß", "ﬀ", "K",
    "ÀÉÎÕÜ", "Ωmega", "ᾨ", "ΐ", "Ǆ", "\u0130i\u0307", "ﬆ", "ｱｲｳ", "ﾊﾟ", "ㄱㅏ", "각",
    "\u1100\u1161\u11a8", "ꙮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙", "🏳️‍🌈", "\U0001F9D1\u200d\U0001F4BB",
    "אבג", "مرحبا", "ไทย", "ᚠᚢᚦ", "\u0600\u0601x", "\ue000private", "\U000e0041tag",
    "x\u0300\u0316y", "\u0345", "ﷺ", "㍿", "㈱", "℃", "Å", "Ⅷ", "ǰ̌",
]
PUNCT = ["!", "?", ".", ",", ";", ":", "...", "!!!", "?!", "--", "-", "(", ")", "[x]", "{y}",
         "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "\"", "'", "`", "<", ">",
         "<|endoftext|>", "<|startoftext|>", "<|ENDOFTEXT|>", "#", "@user", "http://x.io/a?b=1",
         "a_b", "c/d", "e\\f", "~", "^", "&", "*", "+=", "=="]


def captions(seed):
    r = random.Random(1000 + seed)
    # the first ENC_CAPTIONS also go through the encoders
    out = ["a photo of a cat", " ".join(r.choice(WORDS) for _ in range(90)),
           "Crème brûlée at the Café, 東京 😀", "A PHOTO OF A CAT", "", " ".join(["word"] * 120),
           " ", "   ", "\t\n", "a", "A", "  leading and trailing  ",
           "multiple    spaces\t\ttabs\n\nnewlines", "it's don't we're they've I'm you'll he'd",
           "IT'S DON'T", "1234567890", "3.14159", "100,000 people", "x" * 300]
    out += UNI + PUNCT
    for _ in range(1200 - len(out)):
        k = r.randint(1, 14)
        parts = []
        for _ in range(k):
            x = r.random()
            if x < 0.55:
                w = r.choice(WORDS)
                y = r.random()
                w = w.upper() if y < 0.1 else w.capitalize() if y < 0.25 else w
            elif x < 0.75:
                w = r.choice(UNI)
            elif x < 0.88:
                w = r.choice(PUNCT)
            elif x < 0.95:
                w = str(r.randint(0, 10 ** r.randint(1, 6)))
            else:  # random code points from interesting blocks
                blocks = [(0x20, 0x7F), (0xA0, 0x250), (0x300, 0x370), (0x370, 0x500),
                          (0x2000, 0x2070), (0x3000, 0x3100), (0x4E00, 0x4F00), (0xAC00, 0xAD00),
                          (0xFF00, 0xFFEF), (0x1F300, 0x1F680), (0x1, 0x20), (0x80, 0xA0)]
                lo, hi = r.choice(blocks)
                w = "".join(chr(r.randrange(lo, hi)) for _ in range(r.randint(1, 6)))
            parts.append(w)
        sep = r.choice([" ", " ", " ", "", "  ", "\t", "\n"])
        out.append(sep.join(parts))
    assert not any("\0" in c for c in out)  # C strings: a NUL would end the caption
    return out


def make_tokenizer(out):
    d = os.path.join(out, "tokenizer")
    os.makedirs(d, exist_ok=True)
    # FLUX.1's tokenizer_config.json settings
    tok = CLIPTokenizer(os.path.join(BPE, "vocab.json"), os.path.join(BPE, "merges.txt"),
                        model_max_length=77, pad_token="<|endoftext|>", do_lower_case=True)
    tok.save_pretrained(d)
    for f in ("added_tokens.json",):  # a duplicate of the specials; FLUX's folder has none
        p = os.path.join(d, f)
        if os.path.exists(p):
            os.remove(p)
    return d


def load_tokenizers(d):
    slow = CLIPTokenizer.from_pretrained(d)
    assert slow.fix_text is None, "ftfy is installed: goldens are for transformers without ftfy"
    fast = CLIPTokenizerFast.from_pretrained(d)
    return slow, fast


def tok_golden(d, caps):
    slow, fast = load_tokenizers(d)
    g = {"transformers": __import__("transformers").__version__,
         "tokenizers": __import__("tokenizers").__version__,
         "captions": caps,
         "slow": [slow(c).input_ids for c in caps],
         "fast": [fast(c).input_ids for c in caps]}
    padded = []
    for i, c in enumerate(caps[:: max(1, len(caps) // 40)]):
        for T in (77, 16):
            ids = slow(c, padding="max_length", max_length=T, truncation=True).input_ids
            padded.append({"caption": c, "max_length": T, "ids": ids})
    g["padded"] = padded
    return g


def make_model(out, name, seed, act, eos, dtype, shard):
    torch.manual_seed(seed)
    cfg = CLIPTextConfig(vocab_size=2014, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
                         hidden_act=act, layer_norm_eps=1e-5, bos_token_id=0 if eos == 2 else 2012,
                         pad_token_id=1, eos_token_id=eos, projection_dim=32)
    m = CLIPTextModel(cfg).eval()
    with torch.no_grad():  # weights far from the init so every tensor matters
        for n, p in m.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embedding" in n:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 1.5 / p.shape[1] ** 0.5)
    d = os.path.join(out, name)
    m.to(dtype).save_pretrained(d, safe_serialization=True,
                                max_shard_size="100KB" if shard else "10GB")
    return d


def enc_golden(tokdir, models, caps):
    slow, _ = load_tokenizers(tokdir)
    out = {}
    ids = slow(caps, padding="max_length", max_length=77, truncation=True,
               return_tensors="pt").input_ids
    # a raw row without <|endoftext|> whose largest id is not first: the two
    # pooling rules differ on it
    raw = torch.tensor([[2012] + [(37 * i + 5) % 2000 for i in range(76)]])
    ids = torch.cat([ids, raw])
    for name, d in models.items():
        m = CLIPTextModel.from_pretrained(d, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            o = m(ids)
        out[name + ".ids"] = ids.to(torch.int32)
        out[name + ".last_hidden_state"] = o.last_hidden_state.float()
        out[name + ".pooler_output"] = o.pooler_output.float()
    return out


def write_st(path, tensors):
    codes = {torch.float32: "F32", torch.int32: "I32"}
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        raw = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": codes[t.dtype], "shape": list(t.shape),
                     "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dt = {"F32": torch.float32, "I32": torch.int32}[v["dtype"]]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=dt).reshape(v["shape"])
    return out


MODELS = {"text_encoder": ("quick_gelu", 2, torch.float16, False),
          "text_encoder_gelu": ("gelu", 2013, torch.bfloat16, True)}
ENC_CAPTIONS = 6


def check(d):
    g = json.load(open(os.path.join(d, "tok_golden.json")))
    caps = g["captions"]
    fresh = tok_golden(os.path.join(d, "tokenizer"), caps)
    bad = 0
    for key in ("slow", "fast"):
        diff = [i for i in range(len(caps)) if fresh[key][i] != g[key][i]]
        bad += len(diff)
        print("%s: %d of %d captions differ" % (key, len(diff), len(caps)))
    bad += fresh["padded"] != g["padded"]
    models = {n: os.path.join(d, n) for n in MODELS}
    ref = read_st(os.path.join(d, "enc_golden.safetensors"))
    enc_caps = caps[:ENC_CAPTIONS]
    now = enc_golden(os.path.join(d, "tokenizer"), models, enc_caps)
    for k, v in now.items():
        if v.dtype == torch.int32:
            ok = torch.equal(v, ref[k])
            e = 0.0 if ok else 1.0
        else:
            e = float((v - ref[k]).abs().max() / ref[k].abs().max())
            ok = e <= 1e-5
        bad += not ok
        print("%s: %s (rel %.2e)" % (k, "ok" if ok else "DIFFERS", e))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "tests", "data", "clip"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check")
    a = ap.parse_args()
    if a.check:
        sys.exit(1 if check(a.check) else 0)
    out = a.out
    for n in ["tokenizer"] + list(MODELS):
        shutil.rmtree(os.path.join(out, n), ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    tokdir = make_tokenizer(out)
    caps = captions(a.seed)
    g = tok_golden(tokdir, caps)
    with open(os.path.join(out, "tok_golden.json"), "w", encoding="utf-8") as f:
        json.dump(g, f, ensure_ascii=False, separators=(",", ":"))
    models = {}
    for i, (n, (act, eos, dt, shard)) in enumerate(MODELS.items()):
        models[n] = make_model(out, n, 10 * a.seed + i, act, eos, dt, shard)
    enc = enc_golden(tokdir, models, caps[:ENC_CAPTIONS])
    write_st(os.path.join(out, "enc_golden.safetensors"), enc)
    nd = sum(s != f for s, f in zip(g["slow"], g["fast"]))
    print("wrote %s: %d captions (slow and fast differ on %d), models %s"
          % (out, len(caps), nd, ", ".join(models)))


if __name__ == "__main__":
    main()
