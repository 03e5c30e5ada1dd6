//! The oldest Rust the probe supports is stated where embedders read it (the crate's docs
//! and the README) and is the `rust-version` Cargo checks and `infra/test-fast.sh` builds
//! the probe with: the three must not drift apart.

use std::path::PathBuf;

fn repo_file(name: &str) -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

#[test]
fn the_docs_state_the_workspace_rust_version() {
    let (_, manifest) = repo_file("../Cargo.toml");
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("rust-version in the workspace's Cargo.toml");
    let stated = format!("Rust {version} or newer");
    for name in ["src/lib.rs", "../README.md"] {
        let (path, text) = repo_file(name);
        // The crate docs wrap lines: compare with the comment markers taken out.
        let flat = text.replace("\n//! ", " ");
        assert!(
            flat.contains(&stated),
            "{} does not say \"{stated}\" (the workspace's rust-version)",
            path.display()
        );
    }
    let (script, fast) = repo_file("../infra/test-fast.sh");
    assert!(
        fast.contains("rust-version") && fast.contains("-p hoptrace-probe"),
        "{} no longer builds the probe with the rust-version",
        script.display()
    );
}
