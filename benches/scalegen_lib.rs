//! The scale-project generator, shared by the `scalegen` binary and the
//! `noop` bench (both include this file with `#[path]`). Standard library
//! only, so the `scalegen` binary needs no dependency.
//!
//! [`generate`] writes a real charly project of N candies and M boxes:
//!
//! * `charly.yml`: version, `discover: [box, candy]`, and defaults with a
//!   custom distro `scale` whose format `none` installs nothing (like
//!   `tests/fixtures/busybox`), so every box resolves without a network,
//!   plus `builder: {npm: b0000}` (box `b0000` produces npm).
//! * `candy/cNNNN/charly.yml`: each candy has a *level* (0–3) and requires
//!   0–3 candies of lower level and lower index, so require chains are at
//!   most 3 deep; the first `max(3, N/100)` candies are *hubs* that 40 % of
//!   requires point at (they end up in most boxes). Env, packages, tasks
//!   (mkdir, write, copy, cmd, user-scope writes), `path_append`. About 45 %
//!   of the candies ship 1–3 config files (0.5–8 KiB, copied by tasks),
//!   15 % a script (1–3 KiB), 2 % a payload of 100 KiB–1 MiB, 4 % a
//!   `package.json` (npm builder candies; never required by another candy
//!   and never in the builder box, so the builder box does not need itself).
//! * `box/bNNNN/charly.yml`: 5–20 candies each (in index order, which agrees
//!   with every require, so no authored-order warnings), 45 % based on an
//!   earlier box (chains of at most 4 boxes), the others on an external image.
//! * With `ninja`, `build.ninja`: one edge per node of charly's
//!   `box generate` graph — `source:candy/*` (its files), `source:box/*`
//!   (its charly.yml), `fragment:BOX/CANDY` (the candy's source digest, with
//!   the candy's files as implicit inputs) and `containerfile:BOX` (its
//!   fragments, its box source and the parent box's Containerfile) — with
//!   trivial commands (`cksum`, `cat`). `ninja -n` over it is the reference
//!   for "nothing to do".
//!
//! The structure is drawn from a xorshift PRNG seeded from (N, M): the same
//! arguments give byte-identical output.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

/// What to generate.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Number of candies.
    pub candies: usize,
    /// Number of boxes.
    pub boxes: usize,
    /// Also write `build.ninja`.
    pub ninja: bool,
}

/// What was generated, and what charly's `box generate --all` graph must
/// look like for it.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Files written (project files; not `build.ninja`).
    pub files: usize,
    /// Bytes written (project files).
    pub bytes: u64,
    /// Candies that carry a `package.json`.
    pub npm_candies: usize,
    /// Boxes based on another box.
    pub boxes_on_boxes: usize,
    /// Longest base chain (boxes).
    pub max_chain: usize,
    /// Expected `source:candy/*` nodes (candies some box installs).
    pub candy_sources: usize,
    /// Expected `fragment:*` nodes.
    pub fragments: usize,
    /// Expected nodes of the `box generate --all` graph.
    pub generate_nodes: usize,
}

/// A small deterministic PRNG (xorshift64*; seeded through splitmix64).
pub struct Rng(u64);

impl Rng {
    /// A generator for a seed.
    pub fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `pct` %.
    pub fn pct(&mut self, pct: usize) -> bool {
        self.below(100) < pct
    }
}

const WORDS: &[&str] = &[
    "alpha", "bravo", "cache", "delta", "echo", "fetch", "gamma", "hotel", "index", "jolly",
    "kilo", "layer", "mount", "node", "oscar", "proxy", "quota", "relay", "shell", "token",
    "umask", "vault", "wheel", "xattr", "yield", "zone", "build", "candy", "daemon", "socket",
];

struct CandyGen {
    name: String,
    level: u8,
    requires: Vec<usize>,
    npm: bool,
    /// (relative path, size in bytes, kind)
    files: Vec<(String, usize, FileKind)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FileKind {
    Conf,
    Script,
    Payload,
    PackageJson,
}

struct BoxGen {
    name: String,
    parent: Option<usize>,
    depth: usize,
    /// Authored candy list (ascending index).
    list: Vec<usize>,
    /// Candies this box installs itself (closure minus the bases'), ascending.
    own: Vec<usize>,
    /// Everything installed in this box's image (bases included).
    installed: BTreeSet<usize>,
}

fn candy_name(i: usize) -> String {
    format!("c{i:04}")
}

fn box_name(i: usize) -> String {
    format!("b{i:04}")
}

/// Draws the structure: candies (levels, requires, files) and boxes (bases,
/// lists, closures).
fn structure(spec: &Spec) -> (Vec<CandyGen>, Vec<BoxGen>) {
    let n = spec.candies;
    let mut rng = Rng::new((n as u64).wrapping_mul(1_000_003) ^ (spec.boxes as u64) << 32);
    let hubs = n.min(3usize.max(n / 100));
    let mut candies: Vec<CandyGen> = Vec::with_capacity(n);
    for i in 0..n {
        let name = candy_name(i);
        let hub = i < hubs;
        let level: u8 = if hub {
            0
        } else {
            match rng.below(100) {
                0..25 => 0,
                25..55 => 1,
                55..80 => 2,
                _ => 3,
            }
        };
        let npm = !hub && n >= 10 && rng.pct(4);
        let mut requires: Vec<usize> = Vec::new();
        if level > 0 {
            let k = match rng.below(100) {
                0..10 => 0,
                10..50 => 1,
                50..85 => 2,
                _ => 3,
            };
            for _ in 0..k {
                let pick = if rng.pct(40) {
                    Some(rng.below(hubs))
                } else {
                    (0..8).map(|_| rng.below(i)).find(|j| {
                        candies[*j].level < level && !candies[*j].npm && !requires.contains(j)
                    })
                };
                if let Some(j) = pick
                    && !requires.contains(&j)
                {
                    requires.push(j);
                }
            }
            requires.sort_unstable();
        }
        let mut files = vec![("charly.yml".to_string(), 0, FileKind::Conf)];
        if rng.pct(45) {
            for k in 0..rng.range(1, 3) {
                // Log-uniform-ish between 512 B and 8 KiB.
                let size = 512 << rng.below(4);
                let size = size + rng.below(size);
                files.push((format!("files/{name}-{k}.conf"), size, FileKind::Conf));
            }
        }
        if rng.pct(15) {
            files.push((
                format!("bin/{name}-tool.sh"),
                rng.range(1024, 3072),
                FileKind::Script,
            ));
        }
        if rng.pct(2) || (i == hubs && n >= 50) {
            files.push((
                "data/payload.dat".to_string(),
                rng.range(100 << 10, 1 << 20),
                FileKind::Payload,
            ));
        }
        if npm {
            files.push(("package.json".to_string(), 0, FileKind::PackageJson));
        }
        candies.push(CandyGen {
            name,
            level,
            requires,
            npm,
            files,
        });
    }

    // Closures (requires, transitively), computed in index order: requires
    // always point at lower indices.
    let mut closure: Vec<BTreeSet<usize>> = Vec::with_capacity(n);
    for (i, c) in candies.iter().enumerate() {
        let mut s = BTreeSet::from([i]);
        for r in &c.requires {
            s.extend(closure[*r].iter().copied());
        }
        closure.push(s);
    }

    let mut boxes: Vec<BoxGen> = Vec::with_capacity(spec.boxes);
    for j in 0..spec.boxes {
        let mut parent = None;
        if j > 0 && rng.pct(45) {
            parent = (0..6).map(|_| rng.below(j)).find(|k| boxes[*k].depth < 4);
        }
        let depth = parent.map_or(1, |p| boxes[p].depth + 1);
        let base_installed: BTreeSet<usize> = parent
            .map(|p| boxes[p].installed.clone())
            .unwrap_or_default();
        let want = rng.range(5, 20).min(n);
        let mut list: BTreeSet<usize> = BTreeSet::new();
        let mut tries = 0;
        while list.len() < want && tries < want * 20 {
            tries += 1;
            let c = if rng.pct(10) {
                rng.below(hubs)
            } else {
                rng.below(n)
            };
            // The builder box never needs a builder; nothing a base already
            // installs is listed again.
            if (j == 0 && closure[c].iter().any(|k| candies[*k].npm)) || base_installed.contains(&c)
            {
                continue;
            }
            list.insert(c);
        }
        let mut own: BTreeSet<usize> = BTreeSet::new();
        for c in &list {
            own.extend(closure[*c].iter().copied());
        }
        let own: Vec<usize> = own.difference(&base_installed).copied().collect();
        let mut installed = base_installed;
        installed.extend(own.iter().copied());
        boxes.push(BoxGen {
            name: box_name(j),
            parent,
            depth,
            list: list.into_iter().collect(),
            own,
            installed,
        });
    }
    (candies, boxes)
}

/// Text that looks like a config file, `size` bytes.
fn conf_text(rng: &mut Rng, name: &str, size: usize) -> Vec<u8> {
    let mut s = format!("# {name}: generated configuration\n[{name}]\n");
    let mut n = 0;
    while s.len() < size {
        let w1 = WORDS[rng.below(WORDS.len())];
        let w2 = WORDS[rng.below(WORDS.len())];
        let _ = writeln!(s, "{w1}_{n} = \"{w2}-{:08x}\"", rng.next_u64() as u32);
        n += 1;
    }
    s.truncate(size.saturating_sub(1));
    s.push('\n');
    s.into_bytes()
}

fn script_text(rng: &mut Rng, name: &str, size: usize) -> Vec<u8> {
    let mut s = format!("#!/bin/sh\n# {name}: generated helper\nset -eu\n");
    let mut n = 0;
    while s.len() < size {
        let w = WORDS[rng.below(WORDS.len())];
        let _ = writeln!(
            s,
            "step_{n}() {{ echo \"{name} {w} {:x}\" >/dev/null; }}",
            rng.next_u64() as u32
        );
        n += 1;
    }
    s.truncate(size.saturating_sub(1));
    s.push('\n');
    s.into_bytes()
}

/// Binary-ish payload (incompressible, like an archive or model shard).
fn payload(rng: &mut Rng, size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(size + 8);
    while v.len() < size {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(size);
    v
}

fn candy_yaml(rng: &mut Rng, c: &CandyGen, all: &[CandyGen]) -> String {
    let name = &c.name;
    let upper = name.to_uppercase();
    let mut y = String::with_capacity(2048);
    let _ = writeln!(y, "candy:");
    let _ = writeln!(y, "    version: 1.{}.{}", c.level, rng.below(20));
    let _ = writeln!(y, "    name: {name}");
    let _ = writeln!(
        y,
        "    description: Generated candy {name} (level {}, {} requires).",
        c.level,
        c.requires.len()
    );
    if !c.requires.is_empty() {
        let _ = writeln!(y, "    require:");
        for r in &c.requires {
            let _ = writeln!(y, "        - {}", all[*r].name);
        }
    }
    let pk = rng.below(7);
    if pk > 0 {
        let _ = writeln!(y, "    package:");
        for k in 0..pk {
            let _ = writeln!(y, "        - {}-{name}-{k}", WORDS[rng.below(WORDS.len())]);
        }
    }
    let _ = writeln!(y, "    env:");
    let _ = writeln!(y, "        {upper}_HOME: /opt/{name}");
    for k in 0..rng.below(4) {
        let _ = writeln!(
            y,
            "        {upper}_{}_{k}: \"{}\"",
            WORDS[rng.below(WORDS.len())].to_uppercase(),
            rng.next_u64() % 100_000
        );
    }
    let has_bin = c.files.iter().any(|f| f.2 == FileKind::Script);
    if has_bin {
        let _ = writeln!(y, "    path_append:");
        let _ = writeln!(y, "        - /opt/{name}/bin");
    }
    let _ = writeln!(y, "    task:");
    let _ = writeln!(y, "        - mkdir: /opt/{name}");
    let _ = writeln!(y, "          user: root");
    let _ = writeln!(y, "          mode: \"0755\"");
    for (path, _, kind) in &c.files {
        let (dest, mode) = match kind {
            FileKind::Conf if path == "charly.yml" => continue,
            FileKind::PackageJson => continue,
            FileKind::Conf => (
                format!("/opt/{name}/{}", path.trim_start_matches("files/")),
                "0644",
            ),
            FileKind::Script => (
                format!("/opt/{name}/bin/{}", path.trim_start_matches("bin/")),
                "0755",
            ),
            FileKind::Payload => (format!("/opt/{name}/data/payload.dat"), "0644"),
        };
        let _ = writeln!(y, "        - copy: {path}");
        let _ = writeln!(y, "          to: {dest}");
        let _ = writeln!(y, "          mode: \"{mode}\"");
        let _ = writeln!(y, "          user: root");
    }
    let _ = writeln!(y, "        - write: /etc/{name}.conf");
    let _ = writeln!(y, "          user: root");
    let _ = writeln!(y, "          content: |");
    for k in 0..rng.range(1, 6) {
        let _ = writeln!(
            y,
            "            {}_{k}={}",
            WORDS[rng.below(WORDS.len())],
            rng.next_u64() % 1_000_000
        );
    }
    if rng.pct(60) {
        let _ = writeln!(y, "        - cmd: |");
        let _ = writeln!(
            y,
            "            echo \"configured {name}\" > /opt/{name}/configured.txt"
        );
        if rng.pct(50) {
            let _ = writeln!(y, "            chmod 0644 /opt/{name}/configured.txt");
        }
        let _ = writeln!(y, "          user: root");
    }
    if rng.pct(30) {
        let _ = writeln!(y, "        - mkdir: \"${{HOME}}/.config/{name}\"");
        let _ = writeln!(y, "          user: \"${{USER}}\"");
        let _ = writeln!(y, "        - write: \"${{HOME}}/.config/{name}/settings\"");
        let _ = writeln!(y, "          user: \"${{USER}}\"");
        let _ = writeln!(y, "          mode: \"0600\"");
        let _ = writeln!(
            y,
            "          content: \"{} = on\\n\"",
            WORDS[rng.below(WORDS.len())]
        );
    }
    y
}

fn box_yaml(b: &BoxGen, j: usize, boxes: &[BoxGen], candies: &[CandyGen]) -> String {
    let mut y = String::with_capacity(512);
    let _ = writeln!(y, "box:");
    let _ = writeln!(y, "    name: {}", b.name);
    let _ = writeln!(y, "    version: 1.0.{}", j % 10);
    match b.parent {
        Some(p) => {
            let _ = writeln!(y, "    base: {}", boxes[p].name);
        }
        None => {
            let _ = writeln!(y, "    base: localhost/charly-scale-base:1");
        }
    }
    if j == 0 {
        let _ = writeln!(y, "    produce: [npm]");
    }
    if b.list.is_empty() {
        let _ = writeln!(y, "    candy: []");
    } else {
        let _ = writeln!(y, "    candy:");
    }
    for c in &b.list {
        let _ = writeln!(y, "        - {}", candies[*c].name);
    }
    y
}

const ROOT_YAML: &str = r#"version: 2026.160.1301
discover: [box, candy]
defaults:
    distro: [scale]
    build: [none]
    builder:
        npm: b0000
distro:
    scale:
        base_user: {name: user, uid: 1000, gid: 1000, home: /home/user}
        format:
            none:
                install_template: |
                    RUN echo "packages:{{range .Packages}} {{.}}{{end}}"
"#;

/// Marker file: a directory holding it may be regenerated over.
pub const MARKER: &str = ".scalegen";

fn write(path: &Path, bytes: &[u8], s: &mut Summary) -> io::Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(path, bytes)?;
    s.files += 1;
    s.bytes += bytes.len() as u64;
    Ok(())
}

/// Writes the project into `out` (created; an existing non-empty directory
/// must be an earlier output of this generator, whose `candy/`, `box/`,
/// `.build/` (where ninja's outputs go too, in `.build/ninja/`, like
/// charly's: outside what either reads as input), an older layout's
/// `.ninja/` and `build.ninja` are replaced).
pub fn generate(out: &Path, spec: &Spec) -> io::Result<Summary> {
    if out.exists() && std::fs::read_dir(out)?.next().is_some() {
        if !out.join(MARKER).is_file() {
            return Err(io::Error::other(format!(
                "{} is not empty and was not made by scalegen (no {MARKER})",
                out.display()
            )));
        }
        for d in ["candy", "box", ".build", ".ninja"] {
            let p = out.join(d);
            if p.exists() {
                std::fs::remove_dir_all(p)?;
            }
        }
        for f in ["build.ninja", ".ninja_log", ".ninja_deps"] {
            let _ = std::fs::remove_file(out.join(f));
        }
    }
    std::fs::create_dir_all(out)?;
    let (candies, boxes) = structure(spec);
    let mut s = Summary::default();
    let header = format!(
        "# Generated by `scalegen --candies {} --boxes {}`; regenerate rather than edit.\n",
        spec.candies, spec.boxes
    );
    std::fs::write(
        out.join(MARKER),
        format!("candies={} boxes={}\n", spec.candies, spec.boxes),
    )?;
    write(
        &out.join("charly.yml"),
        format!("{header}{ROOT_YAML}").as_bytes(),
        &mut s,
    )?;

    // Content comes from a second stream so the structure does not depend
    // on file sizes and vice versa.
    let mut rng = Rng::new(((spec.candies as u64) << 20) ^ spec.boxes as u64 ^ 0xC0FFEE);
    for c in &candies {
        let dir = out.join("candy").join(&c.name);
        write(
            &dir.join("charly.yml"),
            candy_yaml(&mut rng, c, &candies).as_bytes(),
            &mut s,
        )?;
        for (path, size, kind) in &c.files {
            let bytes = match kind {
                FileKind::Conf if path == "charly.yml" => continue,
                FileKind::Conf => conf_text(&mut rng, &c.name, *size),
                FileKind::Script => script_text(&mut rng, &c.name, *size),
                FileKind::Payload => payload(&mut rng, *size),
                FileKind::PackageJson => format!(
                    "{{\"name\": \"{}\", \"private\": true, \"dependencies\": {{\"left-pad\": \"1.3.0\", \"{}-kit\": \"^{}.{}.0\"}}}}\n",
                    c.name,
                    WORDS[rng.below(WORDS.len())],
                    rng.range(1, 9),
                    rng.below(20)
                )
                .into_bytes(),
            };
            write(&dir.join(path), &bytes, &mut s)?;
        }
        if c.npm {
            s.npm_candies += 1;
        }
    }
    for (j, b) in boxes.iter().enumerate() {
        write(
            &out.join("box").join(&b.name).join("charly.yml"),
            box_yaml(b, j, &boxes, &candies).as_bytes(),
            &mut s,
        )?;
        if b.parent.is_some() {
            s.boxes_on_boxes += 1;
        }
        s.max_chain = s.max_chain.max(b.depth);
    }
    let used: BTreeSet<usize> = boxes.iter().flat_map(|b| b.own.iter().copied()).collect();
    s.candy_sources = used.len();
    s.fragments = boxes.iter().map(|b| b.own.len()).sum();
    s.generate_nodes = s.candy_sources + s.fragments + 2 * boxes.len();

    if spec.ninja {
        std::fs::write(out.join("build.ninja"), ninja(&candies, &boxes, &used))?;
    }
    Ok(s)
}

/// The ninja graph equivalent to charly's `box generate --all` graph.
fn ninja(candies: &[CandyGen], boxes: &[BoxGen], used: &BTreeSet<usize>) -> String {
    let mut n = String::with_capacity(256 * (used.len() + boxes.len() * 20));
    n.push_str(
        "# Generated by scalegen: one edge per node of charly's `box generate --all` graph.\n\
         ninja_required_version = 1.5\n\
         builddir = .build/ninja\n\
         rule src\n  command = cksum $in > $out\n  description = SRC $out\n\
         rule frag\n  command = cat $in > $out\n  description = FRAG $out\n\
         rule cf\n  command = cat $in > $out\n  description = CF $out\n\n",
    );
    let files_of = |c: &CandyGen| -> String {
        let mut s = String::new();
        for (p, _, _) in &c.files {
            let _ = write!(s, " candy/{}/{p}", c.name);
        }
        s
    };
    for i in used {
        let c = &candies[*i];
        let _ = writeln!(
            n,
            "build .build/ninja/src/candy/{}.sum: src{}",
            c.name,
            files_of(c)
        );
    }
    for b in boxes {
        let _ = writeln!(
            n,
            "build .build/ninja/src/box/{0}.sum: src box/{0}/charly.yml",
            b.name
        );
    }
    let mut all = String::new();
    for b in boxes {
        let mut frags = String::new();
        for i in &b.own {
            let c = &candies[*i];
            let _ = writeln!(
                n,
                "build .build/ninja/frag/{}/{}: frag .build/ninja/src/candy/{}.sum |{}",
                b.name,
                c.name,
                c.name,
                files_of(c)
            );
            let _ = write!(frags, " .build/ninja/frag/{}/{}", b.name, c.name);
        }
        let parent = b
            .parent
            .map(|p| format!(" .build/ninja/cf/{}/Containerfile", boxes[p].name))
            .unwrap_or_default();
        let _ = writeln!(
            n,
            "build .build/ninja/cf/{0}/Containerfile: cf .build/ninja/src/box/{0}.sum{frags}{parent}",
            b.name
        );
        let _ = write!(all, " .build/ninja/cf/{}/Containerfile", b.name);
    }
    let _ = writeln!(n, "\nbuild all: phony{all}\ndefault all");
    n
}

/// Parses `--candies N --boxes M --out DIR [--ninja]`.
pub fn parse_args(args: &[String]) -> Result<(Spec, PathBuf), String> {
    let mut candies = None;
    let mut boxes = None;
    let mut out = None;
    let mut ninja = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--candies" => {
                candies = Some(
                    val("--candies")?
                        .parse::<usize>()
                        .map_err(|e| format!("--candies: {e}"))?,
                );
            }
            "--boxes" => {
                boxes = Some(
                    val("--boxes")?
                        .parse::<usize>()
                        .map_err(|e| format!("--boxes: {e}"))?,
                );
            }
            "--out" => out = Some(PathBuf::from(val("--out")?)),
            "--ninja" => ninja = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let candies = candies.ok_or("--candies N is required")?;
    let boxes = boxes.ok_or("--boxes M is required")?;
    let out = out.ok_or("--out DIR is required")?;
    if candies == 0 || boxes == 0 {
        return Err("--candies and --boxes must be at least 1".into());
    }
    if candies > 99_999 || boxes > 99_999 {
        return Err("at most 99999 candies and 99999 boxes".into());
    }
    Ok((
        Spec {
            candies,
            boxes,
            ninja,
        },
        out,
    ))
}
