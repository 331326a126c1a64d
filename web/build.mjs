// Builds web/dist/index.html, the one self-contained page `ctuner serve`
// embeds: web/src/index.html with uPlot (npm, pinned in scripts/web_build.sh)
// and web/src/{app.js,style.css} inlined. Usage: node web/build.mjs NODE_MODULES_DIR
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const mods = process.argv[2];
const read = (p) => readFileSync(p, "utf8");
const parts = {
  UPLOT_CSS: read(join(mods, "uplot/dist/uPlot.min.css")),
  UPLOT_JS: read(join(mods, "uplot/dist/uPlot.iife.min.js")),
  APP_CSS: read(join(here, "src/style.css")),
  APP_JS: read(join(here, "src/app.js")),
};
let html = read(join(here, "src/index.html"));
for (const [k, v] of Object.entries(parts)) {
  if (/<\/(script|style)/i.test(v)) throw new Error(`${k} contains a closing tag; cannot inline it`);
  const mark = `/*${k}*/`;
  if (!html.includes(mark)) throw new Error(`web/src/index.html lacks ${mark}`);
  html = html.split(mark).join(v);
}
const version = JSON.parse(read(join(mods, "uplot/package.json"))).version;
html = html.replace("<head>", `<head>\n<!-- built by scripts/web_build.sh from web/src; uPlot ${version} (MIT) -->`);
mkdirSync(join(here, "dist"), { recursive: true });
writeFileSync(join(here, "dist/index.html"), html);
console.log(`web/dist/index.html: ${html.length} bytes (uPlot ${version})`);
