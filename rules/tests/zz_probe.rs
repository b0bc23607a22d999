//! probe
use charly_rules::template::render;
use serde_json::json;
#[test] fn d_small() { for kb in [512usize, 1024, 2048] { for n in [25usize, 50, 100, 150, 199] { let nested = "{{if true}}{{with .}}".repeat(n) + "ok" + &"{{end}}{{end}}".repeat(n);
  let ok = std::thread::Builder::new().stack_size(kb*1024).spawn(move || render("n", &nested, &json!({"a":1})).map(|s| s.len())).unwrap().join(); println!("{kb}KB {n}: {ok:?}"); } } }
