# Sourced by end-to-end tests after common.sh: shapes_fixture COUNT writes
# $tmp/data (COUNT synthetic 16x16 captioned images, seed 5), $tmp/backend.json
# (one local dataset over it, no crop) and $tmp/vae.json (a small
# AutoencoderKL: 2 blocks of 8 and 16 channels, 4 latent channels).
shapes_fixture() {
  "$CT" dataset synth --out "$tmp/data" --count "$1" --seed 5 --size 16x16 >/dev/null || {
    echo "FAIL - synth"
    exit 1
  }
  cat > "$tmp/backend.json" <<JSON
[{"id": "shapes", "type": "local", "instance_data_dir": "$tmp/data", "caption_strategy": "textfile", "crop": false}]
JSON
  cat > "$tmp/vae.json" <<JSON
{"_class_name": "AutoencoderKL", "block_out_channels": [8, 16], "layers_per_block": 1, "latent_channels": 4,
 "norm_num_groups": 4}
JSON
}
