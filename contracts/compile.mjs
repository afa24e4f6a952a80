#!/usr/bin/env node
// Compile the Krill contracts with the pinned solcjs into committed JSON artifacts.
//
// Design decisions:
// - The compiler is the npm `solc` package pinned in package.json (solcjs, no native binary), driven
//   through standard JSON so that every setting is explicit and recorded in the artifact.
// - evmVersion is pinned to "prague": solc 0.8.37 defaults to osaka, which py-evm does not run.
// - Imports resolve through a callback: `@openzeppelin/...` into node_modules, anything else relative
//   to this folder. Nothing is fetched from the network.
// - Each artifact records the compiler version, the settings and the sha256 of every source that
//   went in, so a reviewer can see what produced the bytecode; the test suite recompiles and
//   compares bytecode and ABI byte for byte.
// - Usage: `node contracts/compile.mjs [outDir]` (default krill/chain/artifacts). Test contracts
//   (contracts/test/) are compiled into the same folder under their own names.
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, writeFileSync, mkdirSync, existsSync } from "node:fs";
import { dirname, join, resolve, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..");
const require = createRequire(import.meta.url);
const solc = require(join(root, "node_modules", "solc"));

const outDir = resolve(process.argv[2] ?? join(root, "krill", "chain", "artifacts"));
const EMIT = ["KrillToken", "KrillProtocol", "ReentrantToken", "ReentrantReceiver"];

const settings = {
  evmVersion: "prague",
  optimizer: { enabled: true, runs: 200 },
  metadata: { bytecodeHash: "none", appendCBOR: false },
  outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
};

function sourcesIn(dir, prefix) {
  const out = {};
  for (const name of readdirSync(dir, { withFileTypes: true })) {
    if (name.isDirectory()) Object.assign(out, sourcesIn(join(dir, name.name), `${prefix}${name.name}/`));
    else if (name.name.endsWith(".sol")) out[`${prefix}${name.name}`] = { content: readFileSync(join(dir, name.name), "utf8") };
  }
  return out;
}

const sources = sourcesIn(here, "contracts/");
const imported = {};

function findImports(path) {
  const file = path.startsWith("@openzeppelin/") ? join(root, "node_modules", path) : join(root, path);
  if (!existsSync(file)) return { error: `not found: ${path}` };
  const content = readFileSync(file, "utf8");
  imported[path] = content;
  return { contents: content };
}

const input = { language: "Solidity", sources, settings };
const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImports }));
const errors = (output.errors ?? []).filter((e) => e.severity === "error");
for (const e of output.errors ?? []) process.stderr.write(`${e.formattedMessage}\n`);
if (errors.length) process.exit(1);

const sha256 = (text) => createHash("sha256").update(text, "utf8").digest("hex");
const sourceHashes = {};
for (const [path, { content }] of Object.entries(sources)) sourceHashes[path] = sha256(content);
for (const [path, content] of Object.entries(imported)) sourceHashes[path] = sha256(content);
const sortedHashes = Object.fromEntries(Object.entries(sourceHashes).sort(([a], [b]) => a.localeCompare(b)));

mkdirSync(outDir, { recursive: true });
for (const [path, contracts] of Object.entries(output.contracts)) {
  for (const [name, c] of Object.entries(contracts)) {
    if (!EMIT.includes(name)) continue;
    const artifact = {
      contractName: name,
      sourceName: path,
      compiler: { name: "solcjs", version: solc.version() },
      settings: { evmVersion: settings.evmVersion, optimizer: settings.optimizer, metadata: settings.metadata },
      sources: sortedHashes,
      abi: c.abi,
      bytecode: `0x${c.evm.bytecode.object}`,
      deployedBytecode: `0x${c.evm.deployedBytecode.object}`,
    };
    const file = join(outDir, `${name}.json`);
    writeFileSync(file, `${JSON.stringify(artifact, null, 2)}\n`);
    process.stdout.write(`${relative(root, file)}\n`);
  }
}
