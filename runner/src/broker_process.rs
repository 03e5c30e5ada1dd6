//! The broker a run goes through, as a process on this host: found by the TCP port it
//! listens on, named for the resource table (`broker (mosquitto)`, `broker (java)`), and
//! its program and version read, best effort (Mosquitto from `mosquitto -h`, Apache
//! Kafka from the name of its jar on the class path).

use std::process::Command;

use crate::procfs::{self, Pid};

/// The broker's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerProcess {
    /// Its pid.
    pub pid: u32,
    /// Its role in the resource table: `broker (<command name>)`.
    pub role: String,
    /// Program and version, e.g. `Apache Kafka 3.9.1`, or what could be found.
    pub version: String,
}

impl BrokerProcess {
    /// The process listening on TCP `port`, when this user can see it (root, or the
    /// broker's own user).
    #[must_use]
    pub fn find(port: u16) -> Option<Self> {
        let pid = procfs::listener_pid(port)?;
        let role = procfs::command_name(Pid::Other(pid))
            .map_or_else(|| "broker".to_owned(), |n| format!("broker ({n})"));
        Some(Self {
            pid,
            role,
            version: version(pid),
        })
    }
}

/// The program and version of the broker process `pid`, best effort.
#[must_use]
pub fn version(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    if let Some(v) = kafka_version(&cmdline) {
        return v;
    }
    if cmdline.contains("mosquitto") {
        let exe = cmdline.split(' ').next().unwrap_or("mosquitto").to_owned();
        if let Ok(o) = Command::new(exe).arg("-h").output() {
            let text = String::from_utf8_lossy(&o.stdout);
            if let Some(first) = text.lines().next() {
                return first.trim().to_owned();
            }
        }
        return "Mosquitto".into();
    }
    procfs::command_name(Pid::Other(pid)).unwrap_or_else(|| "unknown".into())
}

/// `Apache Kafka <version>` from a broker's command line: its own jar
/// (`kafka_2.13-3.9.1.jar`) named on the class path, or inside a `dir/*` entry of it.
#[must_use]
pub fn kafka_version(cmdline: &str) -> Option<String> {
    let entries: Vec<&str> = cmdline.split([':', ' ']).collect();
    entries
        .iter()
        .find_map(|e| kafka_jar_version(e.rsplit('/').next().unwrap_or(e)))
        .or_else(|| {
            entries
                .iter()
                .filter_map(|e| e.strip_suffix("/*"))
                .filter_map(|dir| std::fs::read_dir(dir).ok())
                .flat_map(|d| d.flatten())
                .find_map(|f| kafka_jar_version(&f.file_name().to_string_lossy()))
        })
}

/// `Apache Kafka 3.9.1` from the file name `kafka_2.13-3.9.1.jar` (Scala 2.x builds).
fn kafka_jar_version(name: &str) -> Option<String> {
    let stem = name.strip_suffix(".jar")?;
    let version = stem.strip_prefix("kafka_2.")?.split_once('-')?.1;
    Some(format!("Apache Kafka {version}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_jar_names_the_version() {
        assert_eq!(
            kafka_jar_version("kafka_2.13-3.9.1.jar").as_deref(),
            Some("Apache Kafka 3.9.1")
        );
        for other in [
            "kafka-clients-3.9.1.jar",
            "kafka_2.13-3.9.1.pom",
            "scala-library.jar",
        ] {
            assert_eq!(kafka_jar_version(other), None, "{other}");
        }
        let cmdline = "java -Xmx1G -cp /opt/a.jar:/opt/kafka/libs/kafka_2.13-3.8.0.jar:/b.jar kafka.Kafka server.properties";
        assert_eq!(
            kafka_version(cmdline).as_deref(),
            Some("Apache Kafka 3.8.0")
        );
        assert_eq!(kafka_version("/usr/sbin/mosquitto -c /etc/m.conf"), None);
    }

    #[test]
    fn a_class_path_directory_is_looked_into() {
        let dir = std::env::temp_dir().join(format!("hoptrace-kafka-libs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["kafka-clients-3.9.1.jar", "kafka_2.13-3.9.1.jar"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let cmdline = format!("java -cp {}/* kafka.Kafka", dir.display());
        assert_eq!(
            kafka_version(&cmdline).as_deref(),
            Some("Apache Kafka 3.9.1")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_listener_of_this_process_is_found_and_named() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let b = BrokerProcess::find(l.local_addr().unwrap().port()).unwrap();
        assert_eq!(b.pid, std::process::id());
        assert!(b.role.starts_with("broker ("), "{b:?}");
        assert!(!b.version.is_empty());
    }
}
