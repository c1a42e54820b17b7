use tokio::io::AsyncReadExt;

use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What grpc-go sends when the kubelet dials `/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock`.
const SOCKET_AUTHORITY: &str =
    "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.nvidia.com-reg.sock";

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn request(authority: &str, method: &str) -> Fields {
    [
        (":method", method),
        (":scheme", "http"),
        (":path", "/pluginregistration.Registration/GetInfo"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.82.1"),
        ("te", "trailers"),
    ]
    .into_iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn frame(kind: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_frame_header(&mut out, payload.len(), kind, flags, stream_id);
    out.extend_from_slice(payload);
    out
}

/// Runs `input` through the adapter, `chunk` bytes per socket read.
async fn through(input: &[u8], chunk: usize) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let input = input.to_vec();
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        for part in input.chunks(chunk) {
            client.write_all(part).await.unwrap();
            client.flush().await.unwrap();
            tokio::task::yield_now().await;
        }
    });
    let mut fixed = AuthorityFix::new(server);
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 1000];
        loop {
            let n = fixed.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
    };
    tokio::join!(read, async { writer.await.unwrap() });
    out
}

/// Splits the server-side byte stream into frames and decodes each header block.
fn frames_of(bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    assert_eq!(&bytes[..PREFACE.len()], PREFACE);
    let mut at = PREFACE.len();
    let mut out = Vec::new();
    while at < bytes.len() {
        let header = FrameHeader::parse(&bytes[at..at + FRAME_HEADER_LEN]);
        at += FRAME_HEADER_LEN;
        out.push((header, bytes[at..at + header.len].to_vec()));
        at += header.len;
    }
    out
}

fn decode_all(frames: &[(FrameHeader, Vec<u8>)]) -> Vec<Fields> {
    let mut decoder = loona_hpack::Decoder::new();
    frames
        .iter()
        .filter(|(h, _)| h.kind == HEADERS)
        .map(|(h, p)| {
            decoder
                .decode(parse_headers_payload(*h, p).unwrap().1)
                .unwrap()
        })
        .collect()
}

fn value<'a>(fields: &'a Fields, name: &str) -> &'a [u8] {
    &fields.iter().find(|(n, _)| n == name.as_bytes()).unwrap().1
}

#[tokio::test]
async fn socket_path_authority_becomes_localhost_over_any_read_sizes() {
    // Two requests using the dynamic table, as grpc-go sends them: the first adds its fields to
    // the table, the second refers to them.
    let fields = request(SOCKET_AUTHORITY, "POST");
    let mut indexing = Vec::new();
    let mut indexed = Vec::new();
    for (i, (name, value)) in fields.iter().enumerate() {
        indexing.push(0x40); // literal with incremental indexing, new name
        put_int(&mut indexing, 0, 7, name.len());
        indexing.extend(name);
        put_int(&mut indexing, 0, 7, value.len());
        indexing.extend(value);
        put_int(&mut indexed, 0x80, 7, 62 + fields.len() - 1 - i);
    }
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    for (stream, block) in [(1u32, &indexing), (3, &indexed)] {
        input.extend(frame(HEADERS, END_HEADERS, stream, block));
        input.extend(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0])); // DATA
    }
    for chunk in [1, 7, 4096] {
        let out = through(&input, chunk).await;
        let frames = frames_of(&out);
        let kinds: Vec<u8> = frames.iter().map(|(h, _)| h.kind).collect();
        assert_eq!(kinds, [0x4, HEADERS, 0x0, HEADERS, 0x0], "chunk {chunk}");
        for fields in decode_all(&frames) {
            assert_eq!(value(&fields, ":authority"), b"localhost");
            let mut expected = request("localhost", "POST");
            expected.sort();
            let mut got = fields.clone();
            got.sort();
            assert_eq!(got, expected);
        }
        assert_eq!(frames[2].1, [0, 0, 0, 0, 0], "DATA passes unchanged");
        assert_eq!(frames[2].0.flags, END_STREAM);
    }
}

#[tokio::test]
async fn valid_authority_and_connect_keep_their_value() {
    let mut encoder = loona_hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    for (stream, authority, method) in [
        (1, "localhost", "POST"),
        (3, "example.com:443", "POST"),
        (5, SOCKET_AUTHORITY, "CONNECT"),
    ] {
        let fields = request(authority, method);
        let block = encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, stream, &block));
    }
    let decoded = decode_all(&frames_of(&through(&input, 3).await));
    let authorities: Vec<&[u8]> = decoded.iter().map(|f| value(f, ":authority")).collect();
    assert_eq!(
        authorities,
        [
            &b"localhost"[..],
            b"example.com:443",
            SOCKET_AUTHORITY.as_bytes()
        ]
    );
}

#[tokio::test]
async fn padding_priority_and_continuation_are_handled() {
    let mut encoder = loona_hpack::Encoder::new();
    let fields = request(SOCKET_AUTHORITY, "POST");
    let block = encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
    let (first, second) = block.split_at(10);
    let mut payload = vec![3u8]; // pad length
    payload.extend([0x80, 0, 0, 1, 16]); // priority: exclusive, depends on 1, weight 16
    payload.extend(first);
    payload.extend([0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 3, &payload));
    input.extend(frame(CONTINUATION, END_HEADERS, 3, second));
    let frames = frames_of(&through(&input, 5).await);
    assert_eq!(
        frames.len(),
        1,
        "one HEADERS frame, no padding, no CONTINUATION"
    );
    let (header, body) = &frames[0];
    assert_eq!(header.flags, PRIORITY | END_STREAM | END_HEADERS);
    assert_eq!(&body[..5], [0x80, 0, 0, 1, 16]);
    assert_eq!(value(&decode_all(&frames)[0], ":authority"), b"localhost");
}

#[tokio::test]
async fn what_h2_refuses_passes_unchanged() {
    let mut encoder = loona_hpack::Encoder::new();
    let fields = request(SOCKET_AUTHORITY, "POST");
    let block = encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
    let mut size_update_late = block.clone();
    size_update_late.push(0x20); // a dynamic table size update after the fields
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("stream 0", frame(HEADERS, END_HEADERS, 0, &block)),
        (
            "pad longer than the frame",
            frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 1, 2]),
        ),
        (
            "size update after a field",
            frame(HEADERS, END_HEADERS, 1, &size_update_late),
        ),
        ("index 0", frame(HEADERS, END_HEADERS, 1, &[0x80])),
        (
            "CONTINUATION without HEADERS",
            frame(CONTINUATION, END_HEADERS, 1, &block),
        ),
        ("DATA inside a header block", {
            let mut f = frame(HEADERS, 0, 1, &block[..4]);
            f.extend(frame(0x0, 0, 1, b"x"));
            f.extend(frame(CONTINUATION, END_HEADERS, 1, &block[4..]));
            f
        }),
        ("oversized frame", {
            let mut f = Vec::new();
            put_frame_header(&mut f, MAX_FRAME_SIZE as usize + 1, HEADERS, END_HEADERS, 1);
            f.extend(vec![0u8; MAX_FRAME_SIZE as usize + 1]);
            f
        }),
    ];
    for (what, frames) in cases {
        let mut input = PREFACE.to_vec();
        input.extend(&frames);
        assert_eq!(through(&input, 11).await, input, "{what}");
    }
}

#[tokio::test]
async fn an_over_size_header_list_stays_over_size() {
    let mut fields = request(SOCKET_AUTHORITY, "POST");
    fields.push((b"x-big".to_vec(), vec![b'a'; 12_000]));
    fields.push((b"x-big2".to_vec(), vec![b'b'; 6_000]));
    let mut encoder = loona_hpack::Encoder::new();
    let block = encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
    let mut input = PREFACE.to_vec();
    let (first, rest) = block.split_at(MAX_FRAME_SIZE as usize);
    input.extend(frame(HEADERS, END_STREAM, 1, first));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, rest));
    let out = through(&input, 4096).await;
    let mut decoder = loona_hpack::Decoder::new();
    let mut block = Vec::new();
    for (_, payload) in frames_of(&out) {
        block.extend(payload);
    }
    let size: usize = decoder
        .decode(&block)
        .unwrap()
        .iter()
        .map(|(n, v)| n.len() + v.len() + 32)
        .sum();
    assert!(
        size >= MAX_HEADER_LIST_SIZE as usize,
        "h2 must still see {size} as over the limit"
    );
}

#[test]
fn hpack_integers_round_trip() {
    for prefix in [4, 5, 6, 7] {
        for value in [
            0,
            1,
            14,
            15,
            16,
            30,
            31,
            62,
            63,
            126,
            127,
            128,
            300,
            16_384,
            1 << 20,
        ] {
            let mut out = Vec::new();
            put_int(&mut out, 0, prefix, value);
            assert_eq!(
                get_int(&out, prefix),
                Some((value, out.len())),
                "{value}/{prefix}"
            );
        }
    }
    assert_eq!(
        get_int(&[0x7f, 0x80, 0x80, 0x80, 0x80, 0x80], 7),
        None,
        "too long"
    );
}

#[tokio::test]
async fn a_connection_whose_first_authority_is_good_passes_unchanged() {
    // The DRA socket's case (grpc-go sends `localhost` for `unix:` targets): nothing is
    // re-encoded, so h2 sees the client's own bytes and dynamic table. A later bad authority on
    // the same connection is h2's to refuse, as before.
    let mut encoder = loona_hpack::Encoder::new();
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[]));
    for (stream, authority) in [(1u32, "localhost"), (3, SOCKET_AUTHORITY)] {
        let fields = request(authority, "POST");
        let block = encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
        input.extend(frame(HEADERS, END_HEADERS, stream, &block));
        input.extend(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0]));
    }
    for chunk in [1, 9, 4096] {
        assert_eq!(through(&input, chunk).await, input, "chunk {chunk}");
    }
}
