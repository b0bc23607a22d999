//! Schema types for the real charly format.

pub mod boxdef;
pub mod candy;
pub mod project;
pub mod vocab;

pub use boxdef::BoxDef;
pub use candy::{Candy, DistroSection, PackageItem, Service, Shell, Task};
pub use project::{DiscoverItem, ImportItem, RootDoc};
pub use vocab::{Builder, Defaults, Distro, Format, Init, Vocab};
