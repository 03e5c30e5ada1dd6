//! The rows of the run's small tables (`clock.parquet`: every clock status a probe host
//! sent; `probes.parquet`: every Counters frame) as they come in, kept in a file of the run
//! directory rather than in memory, so that what the collector holds does not grow with
//! the run's length: each exporter sends a Counters frame a second and a clock status
//! every five, some 9,000 rows per exporter a day at a few hundred bytes each, which a
//! checkpoint would otherwise copy whole every time it is taken.
//!
//! A file holds one JSON document per line, in the order the frames came. A checkpoint
//! records how long each file was once it was synced; a collector that takes the run up
//! from that checkpoint cuts the file back to that length and the log replay appends what
//! came after. The tables are written from the files when the run closes.
//!
//! Group members ([`crate::kafka`]) read the control topic from its start each time and
//! keep their rows in memory ([`Rows::Memory`]).

use std::fs::File;
use std::io::{BufRead as _, BufReader, BufWriter, Seek as _, SeekFrom, Write as _};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::CollectorError;

/// The clock statuses' file in the run directory.
pub(crate) const CLOCK_ROWS: &str = "clock.jsonl";
/// The Counters frames' file in the run directory.
pub(crate) const COUNTER_ROWS: &str = "probes.jsonl";

/// Rows of one table, in memory or in a file.
pub(crate) enum Rows<T> {
    /// Kept in memory (a group member's, or a collector's before it has a run directory).
    Memory(Vec<T>),
    /// Appended to a file as they come.
    File(RowFile<T>),
}

impl<T> Default for Rows<T> {
    fn default() -> Self {
        Self::Memory(Vec::new())
    }
}

/// A file of rows, one JSON document per line.
pub(crate) struct RowFile<T> {
    path: PathBuf,
    file: BufWriter<File>,
    rows: u64,
    line: Vec<u8>,
    _rows: PhantomData<fn() -> T>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CollectorError + '_ {
    move |source| CollectorError::Io {
        path: path.to_owned(),
        source,
    }
}

impl<T: Serialize + DeserializeOwned> RowFile<T> {
    /// Creates `path` empty (a run, or a log replayed from its start, begins it again).
    pub(crate) fn create(path: PathBuf) -> Result<Self, CollectorError> {
        let file = File::create(&path).map_err(io_err(&path))?;
        Ok(Self::over(path, file, 0))
    }

    /// Opens `path`, written before, cut back to its first `len` bytes (what a checkpoint
    /// recorded), to append to it; the rows it then holds are read back.
    pub(crate) fn reopen(path: PathBuf, len: u64) -> Result<(Self, Vec<T>), CollectorError> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let have = file.metadata().map_err(io_err(&path))?.len();
        if have < len {
            return Err(CollectorError::Io {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{have} bytes, shorter than the {len} the run's checkpoint recorded"),
                ),
            });
        }
        file.set_len(len).map_err(io_err(&path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_err(&path))?;
        let rows = read_rows(&path, &mut file)?;
        file.seek(SeekFrom::End(0)).map_err(io_err(&path))?;
        let n = rows.len() as u64;
        Ok((Self::over(path, file, n), rows))
    }

    fn over(path: PathBuf, file: File, rows: u64) -> Self {
        Self {
            path,
            file: BufWriter::new(file),
            rows,
            line: Vec::with_capacity(512),
            _rows: PhantomData,
        }
    }

    fn push(&mut self, row: &T) -> Result<(), CollectorError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, row).map_err(|e| CollectorError::Io {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        self.line.push(b'\n');
        self.file
            .write_all(&self.line)
            .map_err(io_err(&self.path))?;
        self.rows += 1;
        Ok(())
    }

    /// Writes what is buffered, syncs it when `sync`, and gives the file's length.
    fn flushed_len(&mut self, sync: bool) -> Result<u64, CollectorError> {
        self.file.flush().map_err(io_err(&self.path))?;
        if sync {
            self.file
                .get_ref()
                .sync_data()
                .map_err(io_err(&self.path))?;
        }
        Ok(self
            .file
            .get_ref()
            .metadata()
            .map_err(io_err(&self.path))?
            .len())
    }

    fn all(&mut self) -> Result<Vec<T>, CollectorError> {
        self.flushed_len(false)?;
        let mut file = File::open(&self.path).map_err(io_err(&self.path))?;
        read_rows(&self.path, &mut file)
    }
}

/// Every row of `file` from where it is; a line that does not parse (a file cut by hand)
/// is an error naming the file and the line.
fn read_rows<T: DeserializeOwned>(path: &Path, file: &mut File) -> Result<Vec<T>, CollectorError> {
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io_err(path))?;
        if line.is_empty() {
            continue;
        }
        let row = serde_json::from_str(&line).map_err(|e| CollectorError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {}: {e}", i + 1),
            ),
        })?;
        out.push(row);
    }
    Ok(out)
}

impl<T: Serialize + DeserializeOwned + Clone> Rows<T> {
    /// Adds `row`.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when the file cannot be written.
    pub(crate) fn push(&mut self, row: T) -> Result<(), CollectorError> {
        match self {
            Self::Memory(v) => {
                v.push(row);
                Ok(())
            }
            Self::File(f) => f.push(&row),
        }
    }

    /// Rows held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> u64 {
        match self {
            Self::Memory(v) => v.len() as u64,
            Self::File(f) => f.rows,
        }
    }

    /// Every row, in order (read back from the file).
    ///
    /// # Errors
    /// [`CollectorError::Io`] when the file cannot be read.
    pub(crate) fn all(&mut self) -> Result<Vec<T>, CollectorError> {
        match self {
            Self::Memory(v) => Ok(v.clone()),
            Self::File(f) => f.all(),
        }
    }

    /// The file's length once what is buffered is on the disk (synced); `None` in memory.
    ///
    /// # Errors
    /// [`CollectorError::Io`] when the file cannot be written or synced.
    pub(crate) fn synced_len(&mut self) -> Result<Option<u64>, CollectorError> {
        match self {
            Self::Memory(_) => Ok(None),
            Self::File(f) => f.flushed_len(true).map(Some),
        }
    }

    /// The rows held in memory (none when they are in a file).
    pub(crate) fn in_memory(&self) -> &[T] {
        match self {
            Self::Memory(v) => v,
            Self::File(_) => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hoptrace-rows-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn rows_come_back_in_order_and_a_reopened_file_is_cut_to_its_checkpoint() {
        let d = dir("cut");
        let path = d.join("t.jsonl");
        let mut rows: Rows<(u32, String)> = Rows::File(RowFile::create(path.clone()).unwrap());
        rows.push((1, "a".into())).unwrap();
        rows.push((2, "b\nc".into())).unwrap();
        let len = rows.synced_len().unwrap().unwrap();
        rows.push((3, "after the checkpoint".into())).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows.all().unwrap(),
            vec![
                (1, "a".into()),
                (2, "b\nc".into()),
                (3, "after the checkpoint".into())
            ]
        );
        assert!(rows.in_memory().is_empty());
        drop(rows);
        let (f, back) = RowFile::<(u32, String)>::reopen(path.clone(), len).unwrap();
        assert_eq!(back, vec![(1, "a".into()), (2, "b\nc".into())]);
        let mut rows = Rows::File(f);
        assert_eq!(rows.len(), 2);
        rows.push((4, "d".into())).unwrap();
        assert_eq!(rows.all().unwrap().last().unwrap(), &(4, "d".into()));
        // A checkpoint longer than the file: refused, naming the file.
        let err = RowFile::<(u32, String)>::reopen(path.clone(), 1 << 20)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("t.jsonl") && err.contains("shorter"), "{err}");
        // A line that does not parse: refused with its number.
        std::fs::write(&path, "[1,\"a\"]\nnot json\n").unwrap();
        let err = RowFile::<(u32, String)>::reopen(path, 17)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn memory_rows_are_their_own_snapshot() {
        let mut rows: Rows<u8> = Rows::default();
        rows.push(7).unwrap();
        assert_eq!(rows.in_memory(), &[7]);
        assert_eq!(rows.synced_len().unwrap(), None);
        assert_eq!(rows.all().unwrap(), vec![7]);
    }
}
