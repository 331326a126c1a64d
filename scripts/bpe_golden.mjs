// Expected CLIP BPE token ids from Hugging Face's tokenizers.js
// (@huggingface/tokenizers, npm), for tests/test_bpe.c.
//   node scripts/bpe_golden.mjs DIR > DIR/cases.json     (DIR has vocab.json, merges.txt)
// The tokenizer.json built here is the one Hugging Face ships for
// openai/clip-vit-base-patch32 (normalizer NFC + \s+ -> " " + lowercase, split
// by CLIP's regex, byte-level, BPE with "</w>", <|startoftext|> ... <|endoftext|>),
// with the vocabulary and merges of DIR.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const dir = process.argv[2];
const vocab = JSON.parse(readFileSync(`${dir}/vocab.json`, "utf8"));
const merges = readFileSync(`${dir}/merges.txt`, "utf8")
  .split("\n")
  .filter((l, i) => l.length && !(i === 0 && l.startsWith("#version")));
const bos = vocab["<|startoftext|>"], eos = vocab["<|endoftext|>"];
const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true });
const tokenizerJson = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [special(bos, "<|startoftext|>"), special(eos, "<|endoftext|>")],
  normalizer: {
    type: "Sequence",
    normalizers: [{ type: "NFC" }, { type: "Replace", pattern: { Regex: "\\s+" }, content: " " }, { type: "Lowercase" }],
  },
  pre_tokenizer: {
    type: "Sequence",
    pretokenizers: [
      {
        type: "Split",
        pattern: { Regex: "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+" },
        behavior: "Removed",
        invert: true,
      },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: { type: "RobertaProcessing", sep: ["<|endoftext|>", eos], cls: ["<|startoftext|>", bos], trim_offsets: false, add_prefix_space: false },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: "BPE", dropout: null, unk_token: "<|endoftext|>", continuing_subword_prefix: "", end_of_word_suffix: "</w>",
    fuse_unk: false, byte_fallback: false, vocab, merges,
  },
};
const tokenizerConfig = {
  tokenizer_class: "CLIPTokenizer", model_max_length: 77, do_lower_case: true,
  bos_token: "<|startoftext|>", eos_token: "<|endoftext|>", unk_token: "<|endoftext|>", pad_token: "<|endoftext|>",
};
const tok = new Tokenizer(tokenizerJson, tokenizerConfig);

// ASCII text, lowercase non-ASCII letters (the documented scope of ct_bpe).
const texts = [
  "a large red circle in the center on a white background",
  "a medium magenta triangle at the bottom right on a black background",
  "A Small BLUE Square At The Top Left",
  "",
  "   ",
  "  leading and trailing  ",
  "tabs\tand\nnewlines\r\n  and   runs",
  "Hello, World!",
  "it's they're we've I'm you'll he'd don't",
  "''s 'x a'b ''",
  "numbers 123 4567 3.14 1e-4 x2",
  "punctuation!!! ... ?! (parens) [brackets] {braces} --flag=value",
  "e-mail: someone@example.com, url https://x.y/z?q=1&r=2",
  "café über naïve résumé façade",
  "<|startoftext|>inside<|endoftext|> specials",
  "!<|endoftext|>",
  "snake_case camelCase kebab-case SCREAMING_CASE",
  "the quick brown fox jumps over the lazy dog",
  "zero-redundancy optimizer: partition parameters, gradients and optimizer states across ranks",
  "checkpoint-1200/model.safetensors",
  "\"quoted\" 'single' `backtick`",
  "x".repeat(300),
  "supercalifragilisticexpialidocious antidisestablishmentarianism",
];
const cases = texts.map((text) => ({ text, ids: tok.encode(text).ids }));
process.stdout.write(JSON.stringify({ generator: "@huggingface/tokenizers " + JSON.parse(readFileSync(new URL("../node_modules/@huggingface/tokenizers/package.json", import.meta.url), "utf8")).version, cases }, null, 0) + "\n");
