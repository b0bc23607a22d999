//! Source files and positions.
//!
//! Every file the loader reads is registered in a [`SourceMap`] once, with its
//! project-relative unix path (what reports and keys use) and its text. Values
//! parsed from it carry a [`Span`]: the file id plus byte range, 1-based line
//! and 1-based column, so any later stage can point at the exact place a value
//! came from without re-reading anything.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Index of a file in a [`SourceMap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FileId(pub u32);

/// A position range inside one source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Span {
    /// The file the range is in.
    pub file: FileId,
    /// Byte offset of the start.
    pub offset: u32,
    /// Length in bytes (0 for a point).
    pub len: u32,
    /// 1-based line of the start.
    pub line: u32,
    /// 1-based column (in characters) of the start.
    pub col: u32,
}

/// One registered source file.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Absolute path on disk (never hashed, never printed in outputs).
    pub path: PathBuf,
    /// Path relative to the project root, with `/` separators; used in reports.
    pub rel: String,
    /// The file's text.
    pub text: Arc<str>,
}

/// All files read while loading a project.
#[derive(Debug, Default, Clone)]
pub struct SourceMap {
    files: Vec<SourceFile>,
}

impl SourceMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a file and returns its id.
    pub fn add(&mut self, path: PathBuf, rel: String, text: Arc<str>) -> FileId {
        let id = FileId(u32::try_from(self.files.len()).unwrap_or(u32::MAX));
        self.files.push(SourceFile { path, rel, text });
        id
    }

    /// The file with this id.
    pub fn get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
    }

    /// The display path (project-relative) of a file.
    pub fn rel(&self, id: FileId) -> &str {
        self.get(id).map_or("<unknown>", |f| f.rel.as_str())
    }

    /// The absolute path of a file.
    pub fn path(&self, id: FileId) -> Option<&Path> {
        self.get(id).map(|f| f.path.as_path())
    }

    /// Every registered file, by id.
    pub fn all(&self) -> &[SourceFile] {
        &self.files
    }

    /// Number of registered files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether no file is registered.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Looks a file up by its project-relative path.
    pub fn find_rel(&self, rel: &str) -> Option<FileId> {
        self.files
            .iter()
            .position(|f| f.rel == rel)
            .map(|i| FileId(i as u32))
    }
}

/// Computes byte offsets from (1-based line, 0-based char column) pairs.
///
/// saphyr's markers count characters; miette and slicing need bytes.
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                starts.push(i + 1);
            }
        }
        Self { text, starts }
    }

    /// Byte offset of (1-based line, 0-based char column), clamped to the text.
    pub(crate) fn offset(&self, line: usize, col: usize) -> usize {
        let Some(&start) = self.starts.get(line.saturating_sub(1)) else {
            return self.text.len();
        };
        let rest = &self.text[start..];
        rest.char_indices()
            .nth(col)
            .map_or(self.text.len(), |(i, _)| start + i)
    }
}

/// `path` relative to `base` with `/` separators, using `..` when it is
/// outside (both are absolute); reports never show absolute paths.
pub fn relative(path: &Path, base: &Path) -> String {
    let p: Vec<_> = path.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_string(), b.len() - common).collect();
    parts.extend(
        p[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}
