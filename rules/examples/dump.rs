fn main() {
    let root = std::env::args().nth(1).unwrap();
    let t = std::time::Instant::now();
    let p = charly_rules::load::load(std::path::Path::new(&root), &Default::default()).unwrap();
    eprintln!("loaded in {:?}", t.elapsed());
    for d in p.diags.iter() { println!("{:?} {}", d.severity, d.one_line(&p.sources)); if let Some(h)=&d.hint {println!("   hint: {h}");} }
    println!("namespaces: {:?}", p.namespaces.iter().map(|n| (&n.path, n.boxes.len(), &n.identity, n.imports.keys().collect::<Vec<_>>())).collect::<Vec<_>>());
    println!("candies: {}", p.candies.len());
    println!("vocab: {:?}", p.namespaces[0].vocab.distro.keys().collect::<Vec<_>>());
}
