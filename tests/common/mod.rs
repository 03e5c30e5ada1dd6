//! Helpers shared by the command-line tests.

/// `host:port` from the environment; a failure when integration tests are required.
pub fn broker(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) => Some(v),
        Err(_) => {
            assert!(
                std::env::var("HOPTRACE_INTEGRATION").as_deref() != Ok("1"),
                "{var} is not set but HOPTRACE_INTEGRATION=1: start the brokers with infra/services.sh up"
            );
            eprintln!("skipped: {var} not set (run infra/test.sh)");
            None
        }
    }
}
