use super::*;

#[test]
fn the_live_view_gets_a_free_port_for_port_0() {
    assert_eq!(Addresses::ui("127.0.0.1:7404").unwrap(), "127.0.0.1:7404");
    let picked = Addresses::ui("127.0.0.1:0").unwrap();
    let port: u16 = picked.strip_prefix("127.0.0.1:").unwrap().parse().unwrap();
    assert_ne!(port, 0);
    assert!(Addresses::ui("no-port").is_err());
}
