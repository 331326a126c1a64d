#!/usr/bin/env bash
# Data-loader figures (docs/performance.md, "Data loader"):
#  1. discovery of 10,000 JPEG photos-like images (384-768 px, written once by
#     Pillow into build/bench-data/): the real discovery path (image headers,
#     every core) against decoding every image, as images per second and their
#     ratio — `ctuner bench discovery`;
#  2. latent cache size with compress_disk_cache gzip and zstd relative to raw,
#     on the synthetic shapes (flat colours) and on 500 of the photo-like images.
#   scripts/bench_data.sh [path/to/ctuner]        (the data wait of training is
#   printed by `ctuner train` itself: "data: waited X s ... (Z%)"; see make demo)
set -euo pipefail
CT=$(readlink -f "${1:-build/ctuner}")
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
photos=build/bench-data/photos-10000
if [ ! -f "$photos/.complete" ]; then
  echo "bench_data: writing 10,000 JPEG images into $photos (once)" >&2
  rm -rf "$photos"
  mkdir -p "$photos"
  /usr/bin/python3 - "$photos" <<'PY'
import random, sys
from PIL import Image, ImageFilter
out = sys.argv[1]
rng = random.Random(1)
base = Image.effect_noise((768, 768), 64).convert("RGB").filter(ImageFilter.GaussianBlur(2))
for i in range(10000):
    w, h = rng.choice([(512, 512), (768, 512), (512, 768), (640, 480), (480, 640), (384, 384), (768, 576)])
    x, y = rng.randrange(0, 768 - w + 1), rng.randrange(0, 768 - h + 1)
    im = base.crop((x, y, x + w, y + h))
    im.save(f"{out}/{i:05d}.jpg", quality=90)
    open(f"{out}/{i:05d}.txt", "w").write(f"a photo number {i}\n")
open(f"{out}/.complete", "w").write("10000\n")
PY
fi
echo "== discovery, 10,000 files (page cache warm: the second pass of each mode is quoted)" >&2
"$CT" bench discovery --dir "$photos" >/dev/null
h=$("$CT" bench discovery --dir "$photos")
"$CT" bench discovery --dir "$photos" --decode --limit 2000 >/dev/null
d=$("$CT" bench discovery --dir "$photos" --decode)
echo "$h"
echo "$d"
/usr/bin/python3 -c '
import json, sys
h, d = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"discovery_header_images_per_s": round(h["images_per_s"]), "full_decode_images_per_s": round(d["images_per_s"]),
                  "ratio": round(h["images_per_s"] / d["images_per_s"], 1)}))' "$h" "$d"

echo "== latent cache size: raw vs gzip vs zstd" >&2
"$CT" dataset synth --out "$tmp/shapes" --count 500 --seed 1 --size 64x64 >/dev/null
mkdir -p "$tmp/ph"
jpgs=("$photos"/*.jpg)
for f in "${jpgs[@]:0:500}"; do cp "$f" "${f%.jpg}.txt" "$tmp/ph/"; done
for set in shapes ph; do
  echo "[{\"id\": \"$set\", \"type\": \"local\", \"instance_data_dir\": \"$tmp/$set\", \"caption_strategy\": \"textfile\", \"crop\": true}]" > "$tmp/$set.json"
  for c in raw gzip zstd; do
    extra=()
    [ "$c" != raw ] && extra=(--compress_disk_cache=true --disk_cache_compression=$c)
    res=64; [ "$set" = ph ] && res=256
    "$CT" cache --preset=small --resolution=$res --aspect_bucket_alignment=32 --data_backend_config="$tmp/$set.json" \
      --train_batch_size=4 --output_dir="$tmp/out-$set-$c" "${extra[@]}" >/dev/null 2>&1
    du -sb "$tmp/out-$set-$c/cache/vae/$set" | awk -v s="$set" -v c="$c" '{print s, c, $1}'
  done
done > "$tmp/sizes"
/usr/bin/python3 - "$tmp/sizes" <<'PY'
import json, sys
sz = {}
for line in open(sys.argv[1]):
    s, c, b = line.split()
    sz.setdefault(s, {})[c] = int(b)
for s, v in sz.items():
    print(json.dumps({"set": {"shapes": "synthetic shapes 64x64", "ph": "photo-like 256 px"}[s],
                      "raw_bytes": v["raw"], "gzip_vs_raw": round(v["gzip"] / v["raw"], 3),
                      "zstd_vs_raw": round(v["zstd"] / v["raw"], 3)}))
PY
