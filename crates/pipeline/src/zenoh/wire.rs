//! The bytes on the wire, without Zenoh itself: the key expression of a
//! topic in rmw_zenoh's layout, the CDR form of `sensor_msgs/msg/Image`,
//! and rmw_zenoh's attachment. Plain functions over byte slices, so the
//! unit tests (and a fuzzer) need no session.
//!
//! # Key expression
//!
//! rmw_zenoh puts a topic's data on `<domain>/<topic>/<type>/<type hash>`:
//! the ROS domain id in decimal, the fully qualified topic name without
//! its leading `/`, the DDS-mangled type name, and the type's RIHS01 hash.
//! For `sensor_msgs/msg/Image` the type is [`IMAGE_TYPE`] and the hash
//! [`IMAGE_TYPE_HASH`]: the value `ros2 topic info -v` prints for an Image
//! topic on ROS 2 Jazzy (the ROS 2 documentation's QoS-overrides how-to
//! shows it, and several public rmw_zenoh clients carry the same string);
//! the message definition has not changed since, so Kilted and Rolling
//! give the same hash.
//!
//! # Payload
//!
//! CDR, little endian, plain (encapsulation header `00 01 00 00`), of
//! `sensor_msgs/msg/Image`: `header { stamp { sec: i32, nanosec: u32 },
//! frame_id: string }, height: u32, width: u32, encoding: string,
//! is_bigendian: u8, step: u32, data: sequence<u8>`. A CDR string is a
//! `u32` length that counts its terminating NUL, the bytes, then the NUL;
//! each primitive is aligned to its size, counted from the byte after the
//! encapsulation header. rmw_zenoh sets no Zenoh encoding on its samples
//! (the default, `zenoh/bytes`); neither does this module.
//!
//! # Attachment
//!
//! Each rmw_zenoh sample carries an attachment written with Zenoh's
//! serializer: the string `sequence_number`, an `i64`; the string
//! `source_timestamp`, an `i64` (nanoseconds since the Unix epoch); the
//! string `source_gid`, then the publisher's 16-byte GID as a byte buffer.
//! Strings and buffers are a LEB128 length and the bytes; integers are
//! little endian. (From rmw_zenoh's `attachment_helpers.cpp`, the keyed
//! form of the Jazzy releases.)

use std::fmt;

use crate::frame::PixelFormat;

/// The DDS type name rmw_zenoh uses for `sensor_msgs/msg/Image`.
pub const IMAGE_TYPE: &str = "sensor_msgs::msg::dds_::Image_";

/// The RIHS01 type hash of `sensor_msgs/msg/Image` (ROS 2 Jazzy and
/// later; see the module docs for where it comes from).
pub const IMAGE_TYPE_HASH: &str =
    "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47";

/// The CDR encapsulation header: plain CDR, little endian.
pub const CDR_LE: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

/// Length of a ROS GID in the attachment (`RMW_GID_STORAGE_SIZE`).
pub const GID_LEN: usize = 16;

/// Longest `frame_id` or `encoding` string a decoded sample may carry.
pub const MAX_STRING: usize = 256;

/// Why a topic name, a CDR payload or an attachment was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// A topic name that is not `name(/name)*` of `[A-Za-z0-9_]`.
    Topic {
        /// The name given.
        topic: String,
    },
    /// The payload ends before a field.
    Short {
        /// The field.
        field: &'static str,
        /// Bytes the field needs from `at`.
        need: usize,
        /// Where it starts.
        at: usize,
        /// The payload's length.
        len: usize,
    },
    /// Not the little-endian plain CDR encapsulation.
    Encapsulation {
        /// The first four bytes.
        got: [u8; 4],
    },
    /// A string that is too long, has no NUL at its end, or is not UTF-8.
    String {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Bytes after the image's data.
    Trailing {
        /// How many.
        bytes: usize,
    },
    /// An attachment that is not rmw_zenoh's.
    Attachment {
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Topic { topic } => write!(
                f,
                "`{topic}` is not a topic name: names of A-Z a-z 0-9 _ joined by `/`"
            ),
            WireError::Short {
                field,
                need,
                at,
                len,
            } => write!(
                f,
                "the CDR payload ends before `{field}` ({need} bytes at {at}, {len} bytes in all)"
            ),
            WireError::Encapsulation { got } => write!(
                f,
                "CDR encapsulation {got:02x?}, not little-endian plain CDR (00 01 00 00)"
            ),
            WireError::String { field, reason } => write!(f, "CDR string `{field}`: {reason}"),
            WireError::Trailing { bytes } => {
                write!(f, "{bytes} byte(s) after the image's data")
            }
            WireError::Attachment { reason } => write!(f, "rmw_zenoh attachment: {reason}"),
        }
    }
}

impl std::error::Error for WireError {}

/// The data key of `topic` in ROS domain `domain`, in rmw_zenoh's layout
/// (a leading `/` of the topic is dropped).
///
/// ```
/// use tegra_interop_pipeline::zenoh::wire::image_key;
///
/// let key = image_key(0, "/camera/image_raw")?;
/// assert!(key.starts_with("0/camera/image_raw/sensor_msgs::msg::dds_::Image_/RIHS01_"));
/// assert!(image_key(0, "bad topic").is_err());
/// # Ok::<(), tegra_interop_pipeline::zenoh::wire::WireError>(())
/// ```
///
/// # Errors
/// [`WireError::Topic`] for a name that is empty, has an empty part or a
/// character outside `[A-Za-z0-9_/]`.
pub fn image_key(domain: u32, topic: &str) -> Result<String, WireError> {
    let name = topic.strip_prefix('/').unwrap_or(topic);
    let part_ok =
        |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !name.split('/').all(part_ok) {
        return Err(WireError::Topic {
            topic: topic.to_string(),
        });
    }
    Ok(format!("{domain}/{name}/{IMAGE_TYPE}/{IMAGE_TYPE_HASH}"))
}

/// The ROS `sensor_msgs/image_encodings` name of a pixel format.
pub fn ros_encoding(format: PixelFormat) -> &'static str {
    match format {
        PixelFormat::Gray8 => "mono8",
        PixelFormat::Gray16 => "mono16",
        PixelFormat::Rgba8 => "rgba8",
        PixelFormat::Bgra8 => "bgra8",
    }
}

/// Everything of a `sensor_msgs/msg/Image` but its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    /// `header.stamp.sec`.
    pub sec: i32,
    /// `header.stamp.nanosec`.
    pub nanosec: u32,
    /// `header.frame_id`.
    pub frame_id: String,
    /// Rows.
    pub height: u32,
    /// Pixels per row.
    pub width: u32,
    /// The pixel encoding (`rgba8`, `mono8`, ...).
    pub encoding: String,
    /// 1 where multi-byte pixels are big endian.
    pub is_bigendian: u8,
    /// Bytes per row.
    pub step: u32,
}

/// A CDR writer that aligns from the byte after the encapsulation header.
struct Writer<'a> {
    out: &'a mut Vec<u8>,
    base: usize,
}

impl Writer<'_> {
    fn align(&mut self, n: usize) {
        while !(self.out.len() - self.base).is_multiple_of(n) {
            self.out.push(0);
        }
    }
    fn u32(&mut self, v: u32) {
        self.align(4);
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    fn string(&mut self, s: &str) {
        // Lengths are bounded by the caller (MAX_STRING).
        self.u32(s.len() as u32 + 1);
        self.out.extend_from_slice(s.as_bytes());
        self.out.push(0);
    }
}

/// Appends the CDR of `header` and the length of `data_len` bytes of data
/// to `out`: everything of the message before its data, so the data can
/// then be copied straight into place. Returns the data's offset in `out`.
///
/// # Errors
/// [`WireError::String`] for a `frame_id` or `encoding` over
/// [`MAX_STRING`] bytes or holding a NUL; [`WireError::Short`] for data
/// over `u32::MAX` bytes.
pub fn encode_prefix(
    header: &ImageHeader,
    data_len: usize,
    out: &mut Vec<u8>,
) -> Result<usize, WireError> {
    for (field, s) in [
        ("frame_id", &header.frame_id),
        ("encoding", &header.encoding),
    ] {
        if s.len() > MAX_STRING || s.contains('\0') {
            return Err(WireError::String {
                field,
                reason: "longer than 256 bytes or holding a NUL",
            });
        }
    }
    let len = u32::try_from(data_len).map_err(|_| WireError::Short {
        field: "data",
        need: data_len,
        at: 0,
        len: u32::MAX as usize,
    })?;
    out.extend_from_slice(&CDR_LE);
    let base = out.len();
    let mut w = Writer { out, base };
    w.u32(header.sec as u32);
    w.u32(header.nanosec);
    w.string(&header.frame_id);
    w.u32(header.height);
    w.u32(header.width);
    w.string(&header.encoding);
    w.out.push(header.is_bigendian);
    w.u32(header.step);
    w.u32(len);
    Ok(w.out.len())
}

/// A decoded `sensor_msgs/msg/Image`, its data borrowed from the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageView<'a> {
    /// Everything but the data.
    pub header: ImageHeader,
    /// The pixel bytes.
    pub data: &'a [u8],
}

/// A bounds-checked CDR reader (see [`Writer`] for the alignment).
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, need: usize) -> Result<&'a [u8], WireError> {
        let short = WireError::Short {
            field,
            need,
            at: self.at,
            len: self.bytes.len(),
        };
        let end = self.at.checked_add(need).ok_or(short.clone())?;
        let got = self.bytes.get(self.at..end).ok_or(short)?;
        self.at = end;
        Ok(got)
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        let pad = (4 - (self.at - CDR_LE.len()) % 4) % 4;
        self.take(field, pad)?;
        let b = self.take(field, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn string(&mut self, field: &'static str) -> Result<String, WireError> {
        let len = self.u32(field)? as usize;
        if len == 0 || len > MAX_STRING + 1 {
            return Err(WireError::String {
                field,
                reason: "its length is 0 or over 257 (with its NUL)",
            });
        }
        let b = self.take(field, len)?;
        let (text, nul) = b.split_at(len - 1);
        if nul != [0] {
            return Err(WireError::String {
                field,
                reason: "it does not end in a NUL",
            });
        }
        String::from_utf8(text.to_vec()).map_err(|_| WireError::String {
            field,
            reason: "it is not UTF-8",
        })
    }
}

/// Decodes a CDR `sensor_msgs/msg/Image` (every length checked against
/// the payload before it is used; nothing may follow the data).
///
/// # Errors
/// The first [`WireError`] found.
pub fn decode_image(bytes: &[u8]) -> Result<ImageView<'_>, WireError> {
    let mut r = Reader { bytes, at: 0 };
    let head = r.take("encapsulation", 4)?;
    if head != CDR_LE {
        return Err(WireError::Encapsulation {
            got: [head[0], head[1], head[2], head[3]],
        });
    }
    let sec = r.u32("header.stamp.sec")? as i32;
    let nanosec = r.u32("header.stamp.nanosec")?;
    let frame_id = r.string("header.frame_id")?;
    let height = r.u32("height")?;
    let width = r.u32("width")?;
    let encoding = r.string("encoding")?;
    let is_bigendian = r.take("is_bigendian", 1)?[0];
    let step = r.u32("step")?;
    let len = r.u32("data")? as usize;
    let data = r.take("data", len)?;
    if r.at != bytes.len() {
        return Err(WireError::Trailing {
            bytes: bytes.len() - r.at,
        });
    }
    Ok(ImageView {
        header: ImageHeader {
            sec,
            nanosec,
            frame_id,
            height,
            width,
            encoding,
            is_bigendian,
            step,
        },
        data,
    })
}

/// rmw_zenoh's per-sample attachment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// The publisher's sequence number of the sample (from 1 here, as
    /// rmw_zenoh counts).
    pub sequence_number: i64,
    /// When it was published, in nanoseconds since the Unix epoch.
    pub source_timestamp: i64,
    /// The publisher's GID.
    pub source_gid: [u8; GID_LEN],
}

fn put_leb128(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_leb128(out, b.len() as u64);
    out.extend_from_slice(b);
}

impl Attachment {
    /// The attachment's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(80);
        put_bytes(&mut out, b"sequence_number");
        out.extend_from_slice(&self.sequence_number.to_le_bytes());
        put_bytes(&mut out, b"source_timestamp");
        out.extend_from_slice(&self.source_timestamp.to_le_bytes());
        put_bytes(&mut out, b"source_gid");
        put_bytes(&mut out, &self.source_gid);
        out
    }

    /// Reads an attachment's bytes.
    ///
    /// # Errors
    /// [`WireError::Attachment`] for anything but rmw_zenoh's layout.
    pub fn decode(bytes: &[u8]) -> Result<Attachment, WireError> {
        let bad = |reason| WireError::Attachment { reason };
        let mut at = 0usize;
        let mut field = |len: usize| -> Result<&[u8], WireError> {
            let end = at.checked_add(len).ok_or(bad("a length past the end"))?;
            let b = bytes.get(at..end).ok_or(bad("it ends early"))?;
            at = end;
            Ok(b)
        };
        let mut expect = |key: &[u8], len: usize| -> Result<Vec<u8>, WireError> {
            let n = field(1)?;
            if usize::from(n[0]) != key.len() || field(key.len())? != key {
                return Err(bad(
                    "a key is not sequence_number, source_timestamp, source_gid",
                ));
            }
            if len == GID_LEN {
                let n = field(1)?;
                if usize::from(n[0]) != GID_LEN {
                    return Err(bad("the GID is not 16 bytes"));
                }
            }
            Ok(field(len)?.to_vec())
        };
        let seq = expect(b"sequence_number", 8)?;
        let ts = expect(b"source_timestamp", 8)?;
        let gid = expect(b"source_gid", GID_LEN)?;
        let i64_of = |b: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            i64::from_le_bytes(a)
        };
        let mut source_gid = [0u8; GID_LEN];
        source_gid.copy_from_slice(&gid);
        if at != bytes.len() {
            return Err(bad("bytes after source_gid"));
        }
        Ok(Attachment {
            sequence_number: i64_of(&seq),
            source_timestamp: i64_of(&ts),
            source_gid,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn header() -> ImageHeader {
        ImageHeader {
            sec: 7,
            nanosec: 9,
            frame_id: "cam".into(),
            height: 2,
            width: 3,
            encoding: "rgba8".into(),
            is_bigendian: 0,
            step: 12,
        }
    }

    #[test]
    fn an_image_round_trips_with_cdr_alignment() {
        let data: Vec<u8> = (0..24).collect();
        let mut out = Vec::new();
        let at = encode_prefix(&header(), data.len(), &mut out).unwrap();
        assert_eq!(at, out.len());
        out.extend_from_slice(&data);
        // encapsulation 4; sec, nanosec 8; frame_id 4 + "cam\0" 4;
        // height, width 8; encoding 4 + "rgba8\0" 6 (ends at 34 from the
        // base); is_bigendian at 34; pad to 36; step 4; data length 4.
        assert_eq!(at, 4 + 44);
        assert_eq!(&out[4 + 12..4 + 16], b"cam\0");
        assert_eq!(out[4 + 34], 0);
        assert_eq!(&out[4 + 36..4 + 40], &12u32.to_le_bytes());
        let v = decode_image(&out).unwrap();
        assert_eq!(v.header, header());
        assert_eq!(v.data, &data[..]);
    }

    #[test]
    fn damaged_payloads_are_refused_by_kind() {
        let mut out = Vec::new();
        encode_prefix(&header(), 24, &mut out).unwrap();
        out.extend_from_slice(&[0u8; 24]);
        for cut in [0, 3, 10, 20, out.len() - 1] {
            assert!(
                matches!(decode_image(&out[..cut]), Err(WireError::Short { .. })),
                "{cut}"
            );
        }
        let mut big_endian = out.clone();
        big_endian[1] = 0;
        assert!(matches!(
            decode_image(&big_endian),
            Err(WireError::Encapsulation { .. })
        ));
        let mut no_nul = out.clone();
        no_nul[4 + 15] = b'x';
        assert!(matches!(
            decode_image(&no_nul),
            Err(WireError::String { .. })
        ));
        let mut huge = out.clone();
        huge[4 + 40..4 + 44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_image(&huge), Err(WireError::Short { .. })));
        out.push(1);
        assert_eq!(decode_image(&out), Err(WireError::Trailing { bytes: 1 }));
    }

    #[test]
    fn keys_follow_rmw_zenoh_and_bad_topics_are_refused() {
        assert_eq!(
            image_key(3, "a/b_c").unwrap(),
            format!("3/a/b_c/{IMAGE_TYPE}/{IMAGE_TYPE_HASH}")
        );
        for bad in ["", "/", "a//b", "a/", "a b", "a/*", "x$"] {
            assert!(image_key(0, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_attachment_round_trips_and_checks_its_keys() {
        let a = Attachment {
            sequence_number: 5,
            source_timestamp: -2,
            source_gid: [7; GID_LEN],
        };
        let bytes = a.encode();
        assert_eq!(bytes[0], 15);
        assert_eq!(&bytes[1..16], b"sequence_number");
        assert_eq!(Attachment::decode(&bytes).unwrap(), a);
        for cut in 0..bytes.len() {
            assert!(Attachment::decode(&bytes[..cut]).is_err(), "{cut}");
        }
        let mut wrong = bytes.clone();
        wrong[1] = b'S';
        assert!(Attachment::decode(&wrong).is_err());
    }
}
