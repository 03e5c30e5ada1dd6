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
    /// A table whose rows each end in a horizontal bar of segments (a message's
    /// components, one after the other).
    Timelines(Timelines),
}

/// Rows of cells, each followed by a bar of segments drawn to one scale.
#[derive(Debug, Clone)]
pub struct Timelines {
    /// What each segment is, in bar order.
    pub legend: Vec<String>,
    /// Header of the cells before the bar.
    pub head: Vec<String>,
    /// The rows.
    pub rows: Vec<TimelineRow>,
}

/// One row of [`Timelines`].
#[derive(Debug, Clone)]
pub struct TimelineRow {
    /// Its cells.
    pub cells: Vec<String>,
    /// Each segment's length, ns, in bar order; `None` where unknown. Negative lengths
    /// (clock error) are drawn as nothing.
    pub segments: Vec<Option<i64>>,
}

impl Timelines {
    /// The longest bar's total, ns (at least 1).
    #[must_use]
    pub fn scale_ns(&self) -> i64 {
        self.rows
            .iter()
            .map(|r| r.segments.iter().flatten().map(|&s| s.max(0)).sum::<i64>())
            .max()
            .unwrap_or(0)
            .max(1)
    }
}
