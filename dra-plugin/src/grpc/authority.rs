//! Lets grpc-go clients that dial a bare socket path reach the plugin.
//!
//! The kubelet's plugin watcher dials the registration socket by its path, so grpc-go sends that
//! path, percent-encoded, as the HTTP/2 `:authority`. h2 resets such a stream as malformed
//! (hyperium/h2#442) and has no option to accept it, so [`AuthorityFix`] sits between the socket
//! and h2. It decodes the connection's first request header block: when its `:authority` is a
//! URI authority (or absent), the block and everything after it pass to h2 unchanged, at no cost
//! (grpc-go sends one authority per connection). Otherwise, for the rest of the connection, it
//! decodes each request header block, replaces an `:authority` that is not a URI authority with
//! `localhost` (what grpc-go itself sends for `unix:` targets) and hands h2 the block re-encoded
//! without the dynamic table. Every other byte passes unchanged; what it cannot parse goes to h2
//! as it came, so h2 still refuses everything else it refused before.
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// HTTP/2 settings the adapter must agree on with the h2 server behind it (grpc/server.rs sets
/// them on hyper's builder): frames and header lists over these sizes are h2's to refuse.
pub const MAX_FRAME_SIZE: u32 = 16 * 1024;
pub const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// h2's default SETTINGS_HEADER_TABLE_SIZE: the most dynamic table a client may use.
const HEADER_TABLE_SIZE: usize = 4096;
/// A header block spread over more frames than this is h2's to refuse (it allows five
/// CONTINUATION frames at the sizes above).
const MAX_BLOCK_FRAMES: usize = 6;

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Room made in the input buffer before each socket read.
const READ_CHUNK: usize = 8 * 1024;

/// The client-to-server byte stream of one HTTP/2 connection, with request header blocks
/// rewritten as described in the module docs. Writes go straight to the socket.
pub struct AuthorityFix<S> {
    inner: S,
    /// Bytes read from the socket and not yet looked at.
    input: BytesMut,
    /// Bytes ready for h2.
    output: Vec<u8>,
    /// Where in `output` h2 has read up to.
    output_read: usize,
    state: State,
    block: Option<PendingBlock>,
    decoder: loona_hpack::Decoder<'static>,
    /// Set once the first header block has shown this connection needs its blocks rewritten.
    rewriting: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The connection preface: this many bytes still pass unchanged.
    Preface(usize),
    /// At a frame boundary.
    FrameHeader,
    /// Inside the payload of a frame that passes unchanged: this many bytes left.
    Payload(usize),
    /// Gave up on something h2 will refuse: everything passes unchanged from here on.
    Raw,
}

/// What the block's first frame says about its stream.
struct BlockInfo {
    stream_id: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
}

/// A header block whose CONTINUATION frames have not all arrived.
struct PendingBlock {
    info: BlockInfo,
    fragment: Vec<u8>,
    /// The frames as they came, for h2 if the block turns out not to be parseable.
    raw: Vec<u8>,
    frames: usize,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        Self {
            inner,
            input: BytesMut::new(),
            output: Vec::new(),
            output_read: 0,
            state: State::Preface(PREFACE_LEN),
            block: None,
            decoder,
            rewriting: false,
        }
    }

    /// Moves what `input` holds to `output`, frame by frame, as far as it is complete.
    fn process(&mut self) {
        let input = std::mem::take(&mut self.input);
        let mut at = 0;
        while at < input.len() {
            let available = input.len() - at;
            match self.state {
                State::Raw => {
                    self.output.extend_from_slice(&input[at..]);
                    at = input.len();
                }
                State::Preface(left) | State::Payload(left) => {
                    let n = left.min(available);
                    self.output.extend_from_slice(&input[at..at + n]);
                    at += n;
                    self.state = match (self.state, left - n) {
                        (_, 0) => State::FrameHeader,
                        (State::Preface(_), rest) => State::Preface(rest),
                        (_, rest) => State::Payload(rest),
                    };
                }
                State::FrameHeader => {
                    if available < FRAME_HEADER_LEN {
                        break;
                    }
                    let header = FrameHeader::parse(&input[at..at + FRAME_HEADER_LEN]);
                    let is_block = header.kind == HEADERS || header.kind == CONTINUATION;
                    if !is_block && self.block.is_none() {
                        self.output
                            .extend_from_slice(&input[at..at + FRAME_HEADER_LEN]);
                        at += FRAME_HEADER_LEN;
                        self.state = State::Payload(header.len);
                        continue;
                    }
                    if !is_block || header.len > MAX_FRAME_SIZE as usize {
                        self.give_up();
                        continue;
                    }
                    let frame_len = FRAME_HEADER_LEN + header.len;
                    if available < frame_len {
                        break;
                    }
                    self.header_frame(header, &input[at..at + frame_len]);
                    at += frame_len;
                }
            }
        }
        self.input = input;
        self.input.advance(at);
    }

    /// Takes one HEADERS or CONTINUATION frame (whole, header included).
    fn header_frame(&mut self, header: FrameHeader, frame: &[u8]) {
        let payload = &frame[FRAME_HEADER_LEN..];
        if header.kind == HEADERS {
            // A HEADERS frame in the middle of another block is h2's to refuse.
            match (self.block.is_none(), parse_headers_payload(header, payload)) {
                (true, Some((priority, fragment))) => {
                    let info = BlockInfo {
                        stream_id: header.stream_id,
                        end_stream: header.flags & END_STREAM != 0,
                        priority,
                    };
                    // The usual case, a block in one frame, needs no copy of it.
                    if header.flags & END_HEADERS != 0 {
                        return self.finish_block(&info, fragment, frame);
                    }
                    self.block = Some(PendingBlock {
                        info,
                        fragment: fragment.to_vec(),
                        raw: frame.to_vec(),
                        frames: 1,
                    });
                }
                _ => return self.give_up_with(frame),
            }
        } else {
            match self.block.as_mut() {
                Some(block)
                    if block.info.stream_id == header.stream_id
                        && block.frames < MAX_BLOCK_FRAMES =>
                {
                    block.fragment.extend_from_slice(payload);
                    block.raw.extend_from_slice(frame);
                    block.frames += 1;
                }
                _ => return self.give_up_with(frame),
            }
        }
        if header.flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.finish_block(&block.info, &block.fragment, &block.raw);
        }
    }

    /// The block is complete: decoded, `:authority` mended, re-encoded for h2; `raw` is the
    /// block's frames as they came, for h2 when it does not decode.
    fn finish_block(&mut self, info: &BlockInfo, fragment: &[u8], raw: &[u8]) {
        let Some(mut block) = self.reencode(fragment) else {
            self.output.extend_from_slice(raw);
            self.state = State::Raw;
            return;
        };
        // The first block decides: a good authority lets the whole connection through as it is
        // (h2 then builds the same dynamic table as the client).
        if !self.rewriting && block.bad_authority.is_none() && !block.over_size {
            self.output.extend_from_slice(raw);
            self.state = State::Raw;
            return;
        }
        if !self.rewriting {
            if let Some((_, original)) = &block.bad_authority {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(original),
                    "rewriting this connection's :authority, not a URI authority (a client dialing a socket path)"
                );
            }
            self.rewriting = true;
        }
        if let Some((range, _)) = block.bad_authority.take()
            && !block.connect
        {
            let mut localhost = Vec::with_capacity(10);
            put_int(&mut localhost, 0, 7, LOCALHOST.len());
            localhost.extend_from_slice(LOCALHOST);
            block.encoded.splice(range, localhost);
        }
        if block.over_size {
            // A filler field takes the list over the limit for h2 as well.
            put_literal(
                &mut block.encoded,
                b"x-over-size",
                &vec![b'x'; MAX_HEADER_LIST_SIZE as usize],
            );
        }
        write_block_frames(&mut self.output, info, &block.encoded);
    }

    /// The block re-encoded as literals without indexing (so h2's dynamic table stays empty),
    /// or `None` where h2 would refuse it as undecodable.
    fn reencode(&mut self, fragment: &[u8]) -> Option<Reencoded> {
        if size_update_after_field(fragment) != Some(false) {
            return None;
        }
        let mut block = Reencoded {
            encoded: Vec::with_capacity(fragment.len() * 2 + 64),
            ..Reencoded::default()
        };
        let limit = MAX_HEADER_LIST_SIZE as usize;
        self.decoder
            .decode_with_cb(fragment, |name, value| {
                // Counted as h2 counts; past the limit h2 keeps decoding but drops the fields.
                block.size += name.len() + value.len() + 32;
                if block.size >= limit {
                    block.over_size = true;
                    return;
                }
                block.connect |= &*name == b":method" && &*value == b"CONNECT";
                let out = &mut block.encoded;
                out.push(0); // literal without indexing, new name
                put_int(out, 0, 7, name.len());
                out.extend_from_slice(&name);
                let value_at = out.len();
                put_int(out, 0, 7, value.len());
                out.extend_from_slice(&value);
                if &*name == b":authority"
                    && block.bad_authority.is_none()
                    && http::uri::Authority::try_from(&*value).is_err()
                {
                    block.bad_authority = Some((value_at..out.len(), value.into_owned()));
                }
            })
            .ok()?;
        Some(block)
    }

    fn give_up(&mut self) {
        if let Some(block) = self.block.take() {
            self.output.extend_from_slice(&block.raw);
        }
        self.state = State::Raw;
    }

    fn give_up_with(&mut self, frame: &[u8]) {
        self.give_up();
        self.output.extend_from_slice(frame);
    }
}

/// What `:authority` becomes when it is not a URI authority.
const LOCALHOST: &[u8] = b"localhost";

/// A decoded header block, re-encoded for h2.
#[derive(Default)]
struct Reencoded {
    encoded: Vec<u8>,
    size: usize,
    over_size: bool,
    connect: bool,
    /// Where the value of a `:authority` that is not a URI authority sits in `encoded` (length
    /// prefix included), and the value.
    bad_authority: Option<(std::ops::Range<usize>, Vec<u8>)>,
}

#[derive(Debug, Clone, Copy)]
struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream_id: u32,
}

impl FrameHeader {
    fn parse(b: &[u8]) -> Self {
        Self {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream_id: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }
}

/// A HEADERS payload's priority fields and block fragment, padding removed; `None` where the frame
/// is malformed (h2 refuses those).
fn parse_headers_payload(header: FrameHeader, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    if header.stream_id == 0 {
        return None;
    }
    let mut rest = payload;
    if header.flags & PADDED != 0 {
        let (&pad, tail) = rest.split_first()?;
        rest = tail.get(..tail.len().checked_sub(usize::from(pad))?)?;
    }
    let mut priority = None;
    if header.flags & PRIORITY != 0 {
        let fields: [u8; 5] = rest.get(..5)?.try_into().ok()?;
        priority = Some(fields);
        rest = &rest[5..];
    }
    Some((priority, rest))
}

fn put_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0); // literal without indexing, new name
    put_int(out, 0, 7, name.len());
    out.extend_from_slice(name);
    put_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// An HPACK integer (RFC 7541 section 5.1) with `prefix` bits in the first octet.
#[allow(
    clippy::cast_possible_truncation,
    reason = "each value cast is below 2^prefix <= 2^8, or masked to 7 bits"
)]
fn put_int(out: &mut Vec<u8>, first: u8, prefix: u32, value: usize) {
    debug_assert!((1..=8).contains(&prefix), "an HPACK prefix is 1 to 8 bits");
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Reads an HPACK integer; returns it and the octets it took, or `None` if cut short or huge.
fn get_int(buf: &[u8], prefix: u32) -> Option<(usize, usize)> {
    let max = (1usize << prefix) - 1;
    let first = usize::from(*buf.first()?) & max;
    if first < max {
        return Some((first, 1));
    }
    let mut value = max;
    for (i, &b) in buf.iter().enumerate().skip(1).take(4) {
        value += usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Whether a dynamic table size update follows a header field in the block (h2 refuses that;
/// the decoder used here does not check it); `None` when the block does not parse.
fn size_update_after_field(block: &[u8]) -> Option<bool> {
    let string_len = |buf: &[u8]| -> Option<usize> {
        let (len, n) = get_int(buf, 7)?;
        (n + len <= buf.len()).then_some(n + len)
    };
    let mut at = 0;
    let mut seen_field = false;
    while at < block.len() {
        let b = block[at];
        if b & 0x80 != 0 {
            at += get_int(&block[at..], 7)?.1;
            seen_field = true;
        } else if b & 0xe0 == 0x20 {
            if seen_field {
                return Some(true);
            }
            at += get_int(&block[at..], 5)?.1;
        } else {
            let prefix = if b & 0x40 != 0 { 6 } else { 4 };
            let (index, n) = get_int(&block[at..], prefix)?;
            at += n;
            if index == 0 {
                at += string_len(block.get(at..)?)?;
            }
            at += string_len(block.get(at..)?)?;
            seen_field = true;
        }
    }
    Some(false)
}

/// Writes `encoded` as the HEADERS frame (and CONTINUATION frames) of `block`'s stream.
fn write_block_frames(out: &mut Vec<u8>, block: &BlockInfo, encoded: &[u8]) {
    let max = MAX_FRAME_SIZE as usize;
    let priority = block.priority.as_ref().map_or(&[][..], |p| &p[..]);
    let first_len = encoded.len().min(max - priority.len());
    let mut flags = if block.end_stream { END_STREAM } else { 0 };
    if !priority.is_empty() {
        flags |= PRIORITY;
    }
    let (first, mut rest) = encoded.split_at(first_len);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    put_frame_header(
        out,
        priority.len() + first.len(),
        HEADERS,
        flags,
        block.stream_id,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(max));
        let flags = if tail.is_empty() { END_HEADERS } else { 0 };
        put_frame_header(out, chunk.len(), CONTINUATION, flags, block.stream_id);
        out.extend_from_slice(chunk);
        rest = tail;
    }
}

fn put_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream_id: u32) {
    let len = u32::try_from(len).expect("a frame holds at most MAX_FRAME_SIZE bytes");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.output_read < this.output.len() {
                let ready = &this.output[this.output_read..];
                let n = ready.len().min(buf.remaining());
                buf.put_slice(&ready[..n]);
                this.output_read += n;
                if this.output_read == this.output.len() {
                    this.output.clear();
                    this.output_read = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.state == State::Raw && this.input.is_empty() {
                // Nothing left to look at: the socket's bytes go straight to h2.
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            this.input.reserve(READ_CHUNK);
            let read = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.inner),
                cx,
                &mut this.input
            ))?;
            if read == 0 {
                // End of stream: whatever is left goes to h2 as it came, then the end.
                this.give_up();
                this.output.extend_from_slice(&this.input);
                this.input.clear();
                if this.output.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            this.process();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
