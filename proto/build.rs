// Compiles the kubelet protocols with protox, so no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "pluginregistration.proto",
        "dra_v1.proto",
        "dra_v1beta1.proto",
        "dra_health_v1alpha1.proto",
        "dra_health_v1.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::SmallCodec")
        .compile_fds(fds)?;
    Ok(())
}
