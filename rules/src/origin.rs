//! From a failed build step back to the candy file: which instruction of a
//! rendered Containerfile a builder's `STEP n/m` names, and which task,
//! package or section of which candy wrote it ([`Origin`]), at file:line:col.

use crate::emit::containerfile::Origin;
use crate::project::Project;
use crate::source::Span;

/// The byte offset of instruction `step` (1-based; 1 is the `FROM`) of
/// stage `stage` (1-based) in a Containerfile, counting as buildah does:
/// comments and blank lines are not instructions, a line ending in `\`
/// continues, and the `ARG`s before the first `FROM` belong to no stage.
pub fn instruction_offset(text: &str, stage: usize, step: usize) -> Option<usize> {
    let mut stage_no = 0usize;
    let mut step_no = 0usize;
    let mut offset = 0usize;
    let mut continued = false;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let body = line.trim_end_matches(['\n', '\r']);
        let was_continued = continued;
        continued = body.trim_end().ends_with('\\');
        if was_continued {
            continue;
        }
        let t = body.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continued = false;
            continue;
        }
        let word = t.split_whitespace().next().unwrap_or("");
        if word.eq_ignore_ascii_case("FROM") {
            stage_no += 1;
            step_no = 0;
        }
        if stage_no == 0 {
            continue;
        }
        step_no += 1;
        if stage_no == stage && step_no == step {
            return Some(start);
        }
    }
    None
}

/// A place in a candy file, with what is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// The candy.
    pub candy: String,
    /// Project-relative file.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
    /// What is there (`task #3 (cmd)`, `package \`jq\``).
    pub what: String,
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "candy `{}`, {} at {}:{}:{}",
            self.candy, self.what, self.file, self.line, self.col
        )
    }
}

/// Where in its candy file `origin` was written. For packages, the package
/// the build's output names (`log`: the failing command's last lines) when
/// one does, else the first.
pub fn locate(p: &Project, origin: &Origin, log: &[String]) -> Option<Located> {
    let (key, what, span): (&str, String, Span) = match origin {
        Origin::Task(key, i) => {
            let c = p.candies.get(key)?;
            let t = c.def.task.get(*i)?;
            let (verb, v) = t.verbs().into_iter().next()?;
            (key, format!("task #{} ({verb})", i + 1), v.span)
        }
        Origin::Packages(key) => {
            let c = p.candies.get(key)?;
            let all: Vec<&crate::yaml::Spanned<String>> = c
                .def
                .package
                .iter()
                .chain(c.def.distro.iter().flat_map(|(_, d)| d.package.iter()))
                .map(|i| &i.name)
                .collect();
            let named = all.iter().find(|n| {
                log.iter().any(|l| {
                    l.split(|ch: char| !(ch.is_ascii_alphanumeric() || "+-._:".contains(ch)))
                        .any(|w| w == n.value)
                })
            });
            let n = named.or(all.first())?;
            (key, format!("package `{}`", n.value), n.span)
        }
        Origin::LocalPkg(key) => {
            let c = p.candies.get(key)?;
            let l = c.def.localpkg.as_ref()?;
            (key, "localpkg".to_string(), l.span)
        }
        Origin::Setup(key) | Origin::Builder(key) | Origin::Shell(key) => {
            let c = p.candies.get(key)?;
            let what = match origin {
                Origin::Setup(_) => "environment, artifacts and data",
                Origin::Builder(_) => "builder",
                _ => "shell snippets",
            };
            (key, what.to_string(), c.span)
        }
    };
    let c = p.candies.get(key)?;
    Some(Located {
        candy: c.name.clone(),
        file: p.sources.rel(span.file).to_string(),
        line: span.line,
        col: span.col,
        what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# layer: candy x\nARG PARENT\nFROM scratch AS x\nCOPY candy/x/ /\n\nFROM ${PARENT}\nUSER root\n# candy: x\nRUN a && \\\n    b\nRUN c\n";

    #[test]
    fn steps_count_as_buildah_counts_them() {
        let at = |stage, step| instruction_offset(TEXT, stage, step).map(|o| &TEXT[o..]);
        assert!(at(1, 1).unwrap().starts_with("FROM scratch AS x"));
        assert!(at(1, 2).unwrap().starts_with("COPY candy/x/"));
        assert_eq!(at(1, 3), None);
        assert!(at(2, 1).unwrap().starts_with("FROM ${PARENT}"));
        assert!(at(2, 3).unwrap().starts_with("RUN a &&"));
        // The continuation line `b` is not an instruction.
        assert!(at(2, 4).unwrap().starts_with("RUN c"));
        assert_eq!(at(2, 5), None);
        assert_eq!(at(3, 1), None);
    }
}
