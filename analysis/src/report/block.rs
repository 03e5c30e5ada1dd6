//! The unit a report is made of, rendered to Markdown and to HTML alike.

/// One block of a report, rendered to Markdown and to HTML alike.
#[derive(Debug, Clone)]
pub enum Block {
    /// A heading of level 1 to 3.
    Heading(u8, String),
    /// A paragraph.
    Para(String),
    /// A bullet list.
    Bullets(Vec<String>),
    /// A table: header and rows.
    Table(Vec<String>, Vec<Vec<String>>),
    /// A chart, by index into the chart list.
    Chart(usize),
}
