//! Report blocks rendered: Markdown with a table of contents and SVG chart images, and one
//! self-contained HTML page with the chart libraries inlined.

use std::fmt::Write as _;

use crate::charts::Chart;

use hoptrace_format::units::duration_f64;

use super::block::{Block, Timelines};

/// The anchor of a heading, as GitHub makes it: lower case, letters, digits, `-` and `_`
/// kept, spaces turned into `-`, everything else dropped.
#[must_use]
pub fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchor of every heading of `blocks` (`None` for other blocks), unique within the
/// page: a repeated one gets `-1`, `-2` ... as GitHub numbers them.
#[must_use]
pub fn anchors(blocks: &[Block]) -> Vec<Option<String>> {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    blocks
        .iter()
        .map(|b| match b {
            Block::Heading(_, t) => {
                let base = slug(t);
                let n = seen.entry(base.clone()).or_default();
                let id = if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                };
                *n += 1;
                Some(id)
            }
            _ => None,
        })
        .collect()
}

/// The table of contents: the headings of levels 2 and 3 after the first heading, as
/// (level, text, anchor); empty when there are fewer than two of level 2.
pub(super) fn contents(blocks: &[Block]) -> Vec<(u8, String, String)> {
    let entries: Vec<(u8, String, String)> = blocks
        .iter()
        .zip(anchors(blocks))
        .skip(1)
        .filter_map(|(b, a)| match (b, a) {
            (Block::Heading(l @ 2..=3, t), Some(a)) => Some((*l, t.clone(), a)),
            _ => None,
        })
        .collect();
    if entries.iter().filter(|e| e.0 == 2).count() < 2 {
        return Vec::new();
    }
    entries
}

pub(super) fn md_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// One Markdown table row of `cells`.
fn md_row(cells: &[String]) -> String {
    format!(
        "| {} |",
        cells
            .iter()
            .map(|c| md_cell(c))
            .collect::<Vec<_>>()
            .join(" | ")
    )
}

/// Renders blocks as Markdown; charts as images `charts/<stem>.svg`.
#[must_use]
pub fn markdown(blocks: &[Block], charts: &[Chart]) -> String {
    let mut out = String::new();
    let toc = contents(blocks);
    for (i, b) in blocks.iter().enumerate() {
        match b {
            Block::Heading(l, t) => {
                let _ = writeln!(out, "{} {t}\n", "#".repeat(usize::from(*l)));
                if i == 0 && !toc.is_empty() {
                    out.push_str("**Contents**\n\n");
                    for (level, text, anchor) in &toc {
                        let indent = if *level == 3 { "  " } else { "" };
                        let _ = writeln!(
                            out,
                            "{indent}- [{}](#{anchor})",
                            text.replace('[', "\\[").replace(']', "\\]")
                        );
                    }
                    out.push('\n');
                }
            }
            Block::Para(t) => {
                let _ = writeln!(out, "{t}\n");
            }
            Block::Bullets(items) => {
                for i in items {
                    let _ = writeln!(out, "- {i}");
                }
                out.push('\n');
            }
            Block::Table(head, rows) => {
                let line = |cells: &[String]| md_row(cells);
                let _ = writeln!(out, "{}", line(head));
                let _ = writeln!(out, "|{}", " --- |".repeat(head.len()));
                for r in rows {
                    let _ = writeln!(out, "{}", line(r));
                }
                out.push('\n');
            }
            Block::Chart(i) => {
                let c = &charts[*i];
                let _ = writeln!(out, "![{}](charts/{}.svg)\n", c.title, c.stem);
            }
            Block::Timelines(t) => markdown_timelines(&mut out, t),
        }
    }
    out
}

/// Width of a Markdown timeline bar, characters.
const BAR_CHARS: i64 = 40;

/// The letter of segment `i` in a Markdown bar.
fn segment_letter(i: usize) -> char {
    char::from(b'a' + u8::try_from(i % 26).unwrap_or(0))
}

/// A timeline table in Markdown: the bar is letters, one per segment, each segment's
/// share of [`BAR_CHARS`] at the longest bar's scale (at least one letter for a segment
/// that is not empty).
fn markdown_timelines(out: &mut String, t: &Timelines) {
    let scale = t.scale_ns();
    let legend: Vec<String> = t
        .legend
        .iter()
        .enumerate()
        .map(|(i, l)| format!("`{}` {l}", segment_letter(i)))
        .collect();
    let _ = writeln!(
        out,
        "Timeline: {}; {BAR_CHARS} characters are {} (a segment shorter than half of one does not show), `?` a segment whose hop is missing.\n",
        legend.join(", "),
        duration_f64(scale as f64)
    );
    let mut head = t.head.clone();
    head.push("Timeline".into());
    let line = |cells: &[String]| md_row(cells);
    let _ = writeln!(out, "{}", line(&head));
    let _ = writeln!(out, "|{}", " --- |".repeat(head.len()));
    for r in &t.rows {
        // Each segment ends where the running total ends, rounded: the bar's length is its
        // total's, and a segment shorter than half a character does not show.
        let mut bar = String::new();
        let (mut total, mut drawn) = (0_i64, 0_i64);
        for (i, s) in r.segments.iter().enumerate() {
            match s {
                Some(ns) => {
                    total += (*ns).max(0);
                    let end = (total.saturating_mul(BAR_CHARS) + scale / 2) / scale;
                    let n = usize::try_from(end - drawn).unwrap_or(0);
                    bar.extend(std::iter::repeat_n(segment_letter(i), n));
                    drawn = drawn.max(end);
                }
                None => bar.push('?'),
            }
        }
        let mut cells = r.cells.clone();
        cells.push(format!("`{bar}`"));
        let _ = writeln!(out, "{}", line(&cells));
    }
    out.push('\n');
}

/// Colours of timeline segments, in order (repeated past the last).
const SEGMENT_COLOURS: [&str; 8] = [
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d",
];

/// A timeline table in HTML: each bar a row of coloured boxes whose widths are the
/// segments' shares of the longest bar, each titled with its segment and length.
fn html_timelines(body: &mut String, t: &Timelines) {
    let scale = t.scale_ns() as f64;
    let colour = |i: usize| SEGMENT_COLOURS[i % SEGMENT_COLOURS.len()];
    body.push_str("<p class=\"legend\">");
    for (i, l) in t.legend.iter().enumerate() {
        let _ = write!(
            body,
            "<span class=\"swatch\" style=\"background:{}\"></span> {} ",
            colour(i),
            esc(l)
        );
    }
    body.push_str("</p>\n<table class=\"timelines\">\n<thead><tr>");
    for h in &t.head {
        let _ = write!(body, "<th>{}</th>", esc(h));
    }
    body.push_str("<th>Timeline</th></tr></thead>\n<tbody>\n");
    for r in &t.rows {
        body.push_str("<tr>");
        for c in &r.cells {
            let _ = write!(body, "<td>{}</td>", esc(c));
        }
        body.push_str("<td class=\"bar\">");
        for (i, s) in r.segments.iter().enumerate() {
            let name = t.legend.get(i).map_or("", String::as_str);
            match s {
                Some(ns) => {
                    let _ = write!(
                        body,
                        "<span class=\"seg\" style=\"width:{:.2}%;background:{}\" title=\"{}: {}\"></span>",
                        (*ns).max(0) as f64 / scale * 100.0,
                        colour(i),
                        esc(name),
                        esc(&hoptrace_format::units::signed_ns(*ns))
                    );
                }
                None => {
                    let _ = write!(
                        body,
                        "<span class=\"missing\" title=\"{}: hop missing\">?</span>",
                        esc(name)
                    );
                }
            }
        }
        body.push_str("</td></tr>\n");
    }
    body.push_str("</tbody>\n</table>\n");
}

pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders blocks as one self-contained HTML page; `libs` are the chart libraries'
/// sources, inlined in order.
#[must_use]
pub fn html(blocks: &[Block], charts: &[Chart], title: &str, libs: &[String]) -> String {
    let mut body = String::new();
    let toc = contents(blocks);
    for (i, (b, anchor)) in blocks.iter().zip(anchors(blocks)).enumerate() {
        match b {
            Block::Heading(l, t) => {
                let id = anchor.unwrap_or_default();
                let _ = writeln!(
                    body,
                    "<h{l} id=\"{}\"><a class=\"anchor\" href=\"#{}\">{}</a></h{l}>",
                    esc(&id),
                    esc(&id),
                    esc(t)
                );
                if i == 0 && !toc.is_empty() {
                    body.push_str("<nav id=\"toc\" aria-label=\"Contents\">\n<div class=\"toc-title\">Contents</div>\n<ul>\n");
                    let mut in_sub = false;
                    for (n, (level, text, anchor)) in toc.iter().enumerate() {
                        let link = format!("<a href=\"#{}\">{}</a>", esc(anchor), esc(text));
                        if *level == 2 {
                            if in_sub {
                                body.push_str("</ul>");
                                in_sub = false;
                            }
                            if n > 0 {
                                body.push_str("</li>\n");
                            }
                            let _ = write!(body, "<li>{link}");
                        } else {
                            if !in_sub {
                                body.push_str("\n<ul>\n");
                                in_sub = true;
                            }
                            let _ = writeln!(body, "<li>{link}</li>");
                        }
                    }
                    body.push_str(if in_sub { "</ul></li>\n" } else { "</li>\n" });
                    body.push_str("</ul>\n</nav>\n");
                }
            }
            Block::Para(t) => {
                let _ = writeln!(body, "<p>{}</p>", esc(t));
            }
            Block::Bullets(items) => {
                body.push_str("<ul>\n");
                for i in items {
                    let _ = writeln!(body, "<li>{}</li>", esc(i));
                }
                body.push_str("</ul>\n");
            }
            Block::Table(head, rows) => {
                body.push_str("<table>\n<thead><tr>");
                for h in head {
                    let _ = write!(body, "<th>{}</th>", esc(h));
                }
                body.push_str("</tr></thead>\n<tbody>\n");
                for r in rows {
                    body.push_str("<tr>");
                    for c in r {
                        let _ = write!(body, "<td>{}</td>", esc(c));
                    }
                    body.push_str("</tr>\n");
                }
                body.push_str("</tbody>\n</table>\n");
            }
            Block::Timelines(t) => html_timelines(&mut body, t),
            Block::Chart(i) => {
                let _ = writeln!(
                    body,
                    "<div class=\"chart\" id=\"chart-{i}\" data-stem=\"{}\"></div>",
                    esc(&charts[*i].stem)
                );
            }
        }
    }
    let specs: Vec<serde_json::Value> = charts.iter().map(|c| c.spec.clone()).collect();
    // `</` cannot appear inside a script element.
    let specs_json = serde_json::to_string(&specs)
        .unwrap_or_default()
        .replace("</", "<\\/");
    let mut scripts = String::new();
    for lib in libs {
        let _ = writeln!(
            scripts,
            "<script>{}</script>",
            lib.replace("</script", "<\\/script")
        );
    }
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 980px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: #f3f3f3; }}
td:nth-child(2) {{ font-variant-numeric: tabular-nums; }}
.chart {{ margin: 1em 0 2em; }}
.chart-error {{ color: #b00; }}
h1 a.anchor, h2 a.anchor, h3 a.anchor {{ color: inherit; text-decoration: none; }}
#toc {{ border: 1px solid #ddd; background: #fafafa; padding: 0.5em 1.2em; margin: 1em 0 2em; }}
#toc .toc-title {{ font-weight: bold; margin: 0.3em 0; }}
#toc ul {{ margin: 0.2em 0; padding-left: 1.2em; }}
td.bar {{ width: 40%; min-width: 16em; white-space: nowrap; }}
td.bar .seg {{ display: inline-block; height: 0.9em; vertical-align: middle; }}
td.bar .missing {{ color: #b00; }}
.legend .swatch {{ display: inline-block; width: 0.9em; height: 0.9em; vertical-align: middle; margin-left: 0.6em; }}
</style>
{scripts}</head>
<body>
{body}<script>
const specs = {specs_json};
const pending = [];
document.querySelectorAll('.chart').forEach((el) => {{
  const i = Number(el.id.slice('chart-'.length));
  pending.push(vegaEmbed(el, specs[i], {{ actions: false, renderer: 'svg' }})
    .then(() => el.setAttribute('data-rendered', 'true'))
    .catch((e) => {{ el.className += ' chart-error'; el.textContent = 'chart failed: ' + e; console.error(e); }}));
}});
Promise.all(pending).then(() => document.body.setAttribute('data-charts', 'done'));
</script>
</body>
</html>
"#,
        title = esc(title),
    )
}
