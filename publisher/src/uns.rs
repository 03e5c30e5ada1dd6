//! Topic names for the streams: an ISA-95 style Unified Namespace tree
//! (`enterprise/site/area/line/cell/tag`), deterministic from a seed, or flat names.
//!
//! ```
//! use hoptrace_publisher::uns::TopicScheme;
//!
//! let topics = TopicScheme::Uns { root: None, seed: 7 }.topics(None, 3000);
//! assert_eq!(topics.len(), 3000);
//! assert_eq!(topics[0].split('/').count(), 6);
//! assert_eq!(topics, TopicScheme::Uns { root: None, seed: 7 }.topics(None, 3000));
//! ```

const ENTERPRISES: &[&str] = &[
    "acme",
    "globex",
    "initech",
    "umbrella",
    "stark",
    "wayne",
    "tyrell",
    "cyberdyne",
];
const SITES: &[&str] = &[
    "berlin",
    "lyon",
    "porto",
    "krakow",
    "austin",
    "osaka",
    "monterrey",
    "pune",
    "turin",
    "ghent",
    "leeds",
    "brno",
];
const AREAS: &[&str] = &[
    "press",
    "assembly",
    "welding",
    "paint",
    "packaging",
    "quality",
    "logistics",
    "utilities",
    "molding",
    "machining",
];
const TAGS: &[&str] = &[
    "temperature",
    "pressure",
    "speed",
    "vibration",
    "current",
    "voltage",
    "flow",
    "level",
    "torque",
    "humidity",
    "count",
    "state",
    "power",
    "position",
    "rpm",
    "load",
];

/// How stream topics are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicScheme {
    /// `enterprise/site/area/line/cell/tag`, with names shuffled by `seed`; `root`
    /// replaces the enterprise name.
    Uns {
        /// Enterprise (first level) name; default chosen by the seed.
        root: Option<String>,
        /// Seed of the name shuffles.
        seed: u64,
    },
    /// `hoptrace/s<stream>`, or `<root>/s<stream>`.
    Flat {
        /// First level; default `hoptrace`.
        root: Option<String>,
    },
}

impl Default for TopicScheme {
    fn default() -> Self {
        Self::Uns {
            root: None,
            seed: 1,
        }
    }
}

/// SplitMix64: a small deterministic generator for names and payload values.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// `n` distinct names for one level: the list shuffled, then `name-2`, `name-3`... when
/// the level needs more names than the list holds.
fn level_names(list: &[&str], n: usize, rng: &mut SplitMix64) -> Vec<String> {
    let mut base: Vec<&str> = list.to_vec();
    rng.shuffle(&mut base);
    (0..n)
        .map(|i| {
            let name = base[i % base.len()];
            let round = i / base.len();
            if round == 0 {
                name.to_owned()
            } else {
                format!("{name}-{}", round + 1)
            }
        })
        .collect()
}

impl TopicScheme {
    /// Topic names of `streams` streams, all distinct, under `prefix` when given.
    ///
    /// The UNS tree gives each of the five levels below the enterprise the same fan-out
    /// `f = ceil(streams^(1/5))`, and numbers the streams in mixed radix over it, so
    /// neighbouring streams share a cell and differ by tag.
    #[must_use]
    pub fn topics(&self, prefix: Option<&str>, streams: u32) -> Vec<String> {
        let pre = prefix
            .filter(|p| !p.is_empty())
            .map(|p| format!("{}/", p.trim_end_matches('/')))
            .unwrap_or_default();
        match self {
            Self::Flat { root } => (0..streams)
                .map(|i| format!("{pre}{}/s{i}", root.as_deref().unwrap_or("hoptrace")))
                .collect(),
            Self::Uns { root, seed } => {
                let mut rng = SplitMix64::new(*seed);
                let mut f = 1usize;
                while f.pow(5) < streams as usize {
                    f += 1;
                }
                let enterprise = root.clone().unwrap_or_else(|| {
                    ENTERPRISES[rng.below(ENTERPRISES.len() as u64) as usize].to_owned()
                });
                let sites = level_names(SITES, f, &mut rng);
                let areas = level_names(AREAS, f, &mut rng);
                let lines: Vec<String> = (1..=f).map(|i| format!("line-{i:02}")).collect();
                let cells: Vec<String> = (1..=f).map(|i| format!("cell-{i:02}")).collect();
                let tags = level_names(TAGS, f, &mut rng);
                (0..streams as usize)
                    .map(|i| {
                        let d = |level: u32| (i / f.pow(level)) % f;
                        format!(
                            "{pre}{enterprise}/{}/{}/{}/{}/{}",
                            sites[d(4)],
                            areas[d(3)],
                            lines[d(2)],
                            cells[d(1)],
                            tags[d(0)]
                        )
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn uns_topics_are_deterministic_distinct_and_six_levels_deep() {
        let a = TopicScheme::Uns {
            root: None,
            seed: 42,
        }
        .topics(None, 3000);
        let b = TopicScheme::Uns {
            root: None,
            seed: 42,
        }
        .topics(None, 3000);
        assert_eq!(a, b, "same seed, same tree");
        let c = TopicScheme::Uns {
            root: None,
            seed: 43,
        }
        .topics(None, 3000);
        assert_ne!(a, c, "another seed, another tree");
        assert_eq!(a.iter().collect::<HashSet<_>>().len(), 3000, "distinct");
        for t in &a {
            assert_eq!(t.split('/').count(), 6, "{t}");
            assert!(!t.contains(['+', '#', ' ']), "{t}");
        }
        // Neighbours share everything up to the cell.
        let (p0, _) = a[0].rsplit_once('/').unwrap();
        let (p1, _) = a[1].rsplit_once('/').unwrap();
        assert_eq!(p0, p1);
    }

    #[test]
    fn prefix_root_and_flat() {
        let t = TopicScheme::Uns {
            root: Some("plant".into()),
            seed: 1,
        }
        .topics(Some("test/"), 2);
        assert!(t[0].starts_with("test/plant/"), "{}", t[0]);
        let f = TopicScheme::Flat { root: None }.topics(None, 3);
        assert_eq!(f, vec!["hoptrace/s0", "hoptrace/s1", "hoptrace/s2"]);
    }

    #[test]
    fn many_streams_get_numbered_names() {
        let t = TopicScheme::default().topics(None, 200_000);
        assert_eq!(t.iter().collect::<HashSet<_>>().len(), 200_000);
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = SplitMix64::new(3);
        for n in [1u64, 2, 7, 1000] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
    }
}
