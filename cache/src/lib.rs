//! charly-cache: the content-addressed store (see DESIGN.md §4).
