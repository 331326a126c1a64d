#!/usr/bin/env python3
"""Learn a small CLIP-format BPE tokenizer (vocab.json + merges.txt) from a
caption corpus on stdin, one caption per line.

    build/ctuner dataset prompts --count 20000 --seed 1 \
      | /usr/bin/python3 scripts/bpe_vocab.py --out examples/demo/tokenizer

The layout is CLIP's (openai/clip simple_tokenizer.py): the 256 byte symbols of
bytes_to_unicode, the same with "</w>", one symbol per merge in merge order,
then <|startoftext|> and <|endoftext|>. Merges are learned the classic way
(Sennrich et al. 2016): repeatedly merge the most frequent adjacent pair (ties:
the lexicographically smallest) until every word of the corpus is one symbol.
"""
import argparse, collections, json, os, re, sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-merges", type=int, default=0, help="stop after N merges (0: until every word is one symbol)")
    a = ap.parse_args()
    b2u = bytes_to_unicode()
    words = collections.Counter()
    for line in sys.stdin:
        text = re.sub(r"\s+", " ", line).strip().lower()
        # CLIP's pattern with \p{L} approximated as ASCII letters or any non-ASCII character
        for piece in re.findall(r"'s|'t|'re|'ve|'m|'ll|'d|(?:[a-z]|[^\x00-\x7f])+|[0-9]|[^\sa-z0-9\x80-\U0010ffff]+", text):
            words[piece] += 1
    if not words:
        sys.exit("bpe_vocab.py: empty corpus on stdin")
    segs = {}
    for w in words:
        syms = [b2u[c] for c in w.encode("utf-8")]
        syms[-1] += "</w>"
        segs[w] = syms
    merges = []
    while True:
        pairs = collections.Counter()
        for w, s in segs.items():
            for x, y in zip(s, s[1:]):
                pairs[(x, y)] += words[w]
        if not pairs or (a.max_merges and len(merges) >= a.max_merges):
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w, s in segs.items():
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            segs[w] = out
    vocab = list(b2u.values())
    vocab += [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({v: i for i, v in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(a.out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2 (ctuner scripts/bpe_vocab.py)\n")
        for x, y in merges:
            f.write(f"{x} {y}\n")
    print(json.dumps({"words": len(words), "merges": len(merges), "vocab": len(vocab)}))


if __name__ == "__main__":
    main()
