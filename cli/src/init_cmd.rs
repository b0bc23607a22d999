//! `charly init [DIR]` (a new project, ready to build) and `charly candy
//! new NAME` (a candy skeleton in the current project). Files are created,
//! never overwritten.

use crate::{Cli, output, project};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `init`.
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// Where to create the project (created when missing; default: the
    /// current directory). Refused when it already holds a charly.yml.
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The format to write: `2026.174`, today's node form (each entity a
    /// node named first), or `2026.160`, the classic form (`candy:` and
    /// `box:` documents).
    #[arg(long, value_name = "VERSION", default_value = "2026.174",
          value_parser = clap::builder::PossibleValuesParser::new(["2026.174", "2026.160"]))]
    pub format: String,
}

const ROOT_NODE: &str = "\
# A charly project (schema 2026.174): boxes (images) under box/, candies
# (what goes into them) under candy/, each file a node named first
# (`name:`, then its kind). `charly box list` shows them, `charly box
# build --all` builds them, `charly check --all` runs the candies' checks.
version: 2026.174.1100
discover:
    - box
    - candy
defaults:
    # Every box is Debian 12 unless it says otherwise.
    distro:
        - debian:12
        - debian
    build:
        - deb
";

const BASE_NODE: &str = "\
# The base image: a Debian bookworm root filesystem made with debootstrap
# from the Debian mirror (no registry needed). Versions are CalVer
# (YEAR.DAY.HHMM): bump them when you change a box or candy.
base:
    candy:
        name: base
        version: {version}
        from: builder:debootstrap
";

const APP_NODE: &str = "\
# A box: a candy with a base, plus candies, in this order (their
# requirements first).
app:
    candy:
        name: app
        version: {version}
        base: base
    app-candy:
        candy:
            - hello
";

/// A node-form candy's skeleton; `{name}` and `{version}` are replaced.
const CANDY_NODE: &str = "\
{name}:
    candy:
        version: {version}
        name: {name}
        description: What {name} adds to a box
    # Packages from the distro (apt on Debian).
    {name}-package:
        package:
            - ca-certificates
    # Steps after the packages, in order; `run:` says what the step does
    # (write, mkdir, copy, link, download, cmd).
    {name}-readme:
        run: \"write=/etc/{name}/README\"
        write: /etc/{name}/README
        run_as: root
        mode: \"0644\"
        content: |
            Installed by the {name} candy.
    # A check `charly check` runs in a disposable container of every box
    # using this candy.
    {name}-readme-check:
        check: \"{name}-readme\"
        id: {name}-readme
        plugin: file
        plugin_input:
            file: /etc/{name}/README
            exists: true
            contains:
                - Installed by the {name} candy
";

/// Today as the node form's strict CalVer (`YYYY.DDD.HHMM`, UTC).
fn calver_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let (hh, mm) = ((secs % 86_400) / 3_600, (secs % 3_600) / 60);
    // Whole years from 1970, then the day of the year (1-based).
    let leap = |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    let (mut year, mut day) = (1970u64, days);
    loop {
        let len = if leap(year) { 366 } else { 365 };
        if day < len {
            break;
        }
        day -= len;
        year += 1;
    }
    format!("{year}.{}.{hh:02}{mm:02}", day + 1)
}

const ROOT: &str = "\
# A charly project: boxes (images) under box/, candies (what goes into
# them) under candy/. `charly box list` shows them, `charly box build
# --all` builds them, `charly check --all` runs the candies' checks.
version: 2026.160.1301
discover:
    - box
    - candy
defaults:
    # Every box is Debian 12 unless it says otherwise.
    distro:
        - debian:12
        - debian
    build:
        - deb
";

const BASE: &str = "\
# The base image: a Debian bookworm root filesystem made with debootstrap
# from the Debian mirror (no registry needed).
box:
    name: base
    version: 0.1.0
    from: builder:debootstrap
";

const APP: &str = "\
# A box: the base plus candies, in this order (their requirements first).
box:
    name: app
    version: 0.1.0
    base: base
    candy:
        - hello
";

/// A candy's skeleton; `{name}` is replaced.
const CANDY: &str = "\
candy:
    version: 0.1.0
    name: {name}
    description: What {name} adds to a box
    # Packages from the distro (apt on Debian).
    package:
        - ca-certificates
    # Steps after the packages, in order: cmd, mkdir, copy, write, link, download.
    task:
        - write: /etc/{name}/README
          user: root
          mode: \"0644\"
          content: |
            Installed by the {name} candy.
    # Checks `charly check` runs in a disposable container of every box
    # using this candy.
    eval:
        - id: {name}-readme
          file: /etc/{name}/README
          exists: true
          contains:
              - Installed by the {name} candy
";

/// Writes `text` to `path`, refusing to replace anything.
fn create(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// `charly init`.
pub fn init(a: &InitArgs) -> anyhow::Result<ExitCode> {
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    if dir.join("charly.yml").exists() {
        anyhow::bail!(
            "{} already holds a charly.yml; nothing was written",
            dir.display()
        );
    }
    let version = calver_now();
    let node = |t: &str| t.replace("{version}", &version).replace("{name}", "hello");
    let files = if a.format == "2026.160" {
        [
            ("charly.yml", ROOT.to_string()),
            ("box/base/charly.yml", BASE.to_string()),
            ("box/app/charly.yml", APP.to_string()),
            ("candy/hello/charly.yml", CANDY.replace("{name}", "hello")),
        ]
    } else {
        [
            ("charly.yml", ROOT_NODE.to_string()),
            ("box/base/charly.yml", node(BASE_NODE)),
            ("box/app/charly.yml", node(APP_NODE)),
            ("candy/hello/charly.yml", node(CANDY_NODE)),
        ]
    };
    for (rel, _) in &files {
        if dir.join(rel).exists() {
            anyhow::bail!("{} exists; nothing was written", dir.join(rel).display());
        }
    }
    for (rel, text) in &files {
        create(&dir.join(rel), text)?;
    }
    let shown = a
        .dir
        .as_ref()
        .map_or_else(|| ".".to_string(), |d| d.display().to_string());
    output::note(&format!(
        "created a charly project (schema {}) in {shown}: boxes `base` (Debian bookworm from debootstrap) and `app` (base + candy `hello`)\n\
         next:\n  charly -C {shown} box build --all     # a few minutes the first time; then only what changed\n  \
         charly -C {shown} check --all         # the candies' checks in a disposable container\n  \
         charly -C {shown} candy new NAME      # another candy; add it to box/app/charly.yml",
        a.format
    ));
    Ok(ExitCode::SUCCESS)
}

/// `charly candy new NAME`.
pub fn new_candy(cli: &Cli, name: &str) -> anyhow::Result<ExitCode> {
    if let Err(why) = charly_rules::names::entity(name) {
        anyhow::bail!("`{name}` cannot name a candy: {why}");
    }
    let root = project::root(cli)?;
    let o = project::open(cli)?;
    if o.project.candies.contains_key(name) {
        anyhow::bail!("the project already has a candy `{name}`");
    }
    let rel = format!("candy/{name}/charly.yml");
    // In the project's own format.
    let text = if o.project.root_ns().nodeform {
        CANDY_NODE
            .replace("{version}", &calver_now())
            .replace("{name}", name)
    } else {
        CANDY.replace("{name}", name)
    };
    create(&root.join(&rel), &text)?;
    println!("{rel}");
    output::note(&format!(
        "created candy `{name}`; add it to a box's `candy:` list to build it"
    ));
    Ok(ExitCode::SUCCESS)
}
