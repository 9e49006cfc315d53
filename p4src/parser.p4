/* Parsing: Ethernet / IPv4 / UDP or TCP / memcached UDP frame header / ASCII command, key and the rest of its line.
 * The same reading as dataplanes/bpf/src/parse.h, with v1model's mechanism:
 * - The eBPF program loads the key and scans it a word at a time; a P4 parser can only iterate by going from
 *   state to state, and bmv2 resets every header instance per packet, in use or not: the parts are read in as few
 *   and as wide headers as the reading allows. "get " and "set " in one step. Where a part ends within 8 bytes (the
 *   command word, the key's and the line's last bytes), those 8 (fewer where fewer are left) are looked at and one
 *   select, its entries in order of position, finds the byte that ends it: the command word's and the line's are
 *   widened into meta.s.look (LOOKS), the key's selected on as they are (KEY_LOOK: an operation less per get).
 *   The bytes before it and that byte are taken in one varbit extract (rest_t), the key's last bytes in at most
 *   three chunks (4, 2, 1 bytes), whose value is added to the key. Longer stretches go 32 bytes at a time while
 *   none of them is a byte that would end or change the reading (a select entry per byte and position:
 *   ANY32_BYTE_IS), then 8 at a time. A 32-byte stretch is not taken step by step: each step looks at one window
 *   more (the stretch so far and the next 32 bytes into a scratch field of that width; its last 32 selected on in
 *   one state shared by all the steps) and where the stretch ends its clean windows are taken in one varbit
 *   extract (WINDOW_LOOKS, FLUSHES): one header instance where a stack would be one per window, and `remaining`
 *   counts the bytes not looked at yet. The line's head (to the end of the data length field: fields
 *   counted, digits read) is read a byte at a time from the look, taken 8 at a time, its last bytes in one varbit.
 *   Each part has its own headers, so the deparser emits them in the order they came. The key is accumulated into
 *   one 2000-bit number for hot_keys.
 * - Every parser state and every operation in it costs bmv2 per packet that passes it, and every metadata field
 *   (compiler temporaries included) and header instance per packet whether used or not: a state chooses its
 *   successor's successor where it can, selects are on fields (a comparison, or an expression, would be a compiler
 *   temporary: ranges are mask entries, a sign bit), and where a select is on a field its own state sets, the
 *   select is in a state of its own, its only successor, which p4c merges into it (p4c would otherwise copy the
 *   field into a temporary).
 * - `remaining` (payload bytes not read yet, from the IPv4 total length; after "get " or "set " it counts those 4
 *   until the key's end: key_first_*) guards every lookahead (in a state of its own: a select evaluates all its
 *   keys, lookahead included; a look holds zeros past it), so a short or unpadded frame is never read past its end
 *   and Ethernet padding is never read as payload.
 * - A parser cannot branch on a comparison directly: the length checks are done in the ingress control from
 *   what the parser recorded (ip_end, payload_len, line state). */
#ifndef MB_PARSER_P4
#define MB_PARSER_P4

/* Select entries on a 64-bit lookahead: byte value 0xV at any of the 8 positions goes to `to`. */
#define AT(v, i) (64w0x##v << (8 * (7 - i))) &&& (64w0xff << (8 * (7 - i)))
#define ANY_BYTE_IS(v, to) AT(v, 0): to; AT(v, 1): to; AT(v, 2): to; AT(v, 3): to; \
                           AT(v, 4): to; AT(v, 5): to; AT(v, 6): to; AT(v, 7): to
/* Take the key's N bytes up to a byte that was found at position N as at most three chunks (4, 2, 1 bytes: one
 * header instance each, where N one-byte instances would cost bmv2 N per packet), and their value. */
#define TAKE_1(P) pkt.extract(hdr.P##1);
#define TAKE_2(P) pkt.extract(hdr.P##2);
#define TAKE_3(P) pkt.extract(hdr.P##2); pkt.extract(hdr.P##1);
#define TAKE_4(P) pkt.extract(hdr.P##4);
#define TAKE_5(P) pkt.extract(hdr.P##4); pkt.extract(hdr.P##1);
#define TAKE_6(P) pkt.extract(hdr.P##4); pkt.extract(hdr.P##2);
#define TAKE_7(P) pkt.extract(hdr.P##4); pkt.extract(hdr.P##2); pkt.extract(hdr.P##1);
#define VALUE_1(P) hdr.P##1.v
#define VALUE_2(P) hdr.P##2.v
#define VALUE_3(P) hdr.P##2.v ++ hdr.P##1.v
#define VALUE_4(P) hdr.P##4.v
#define VALUE_5(P) hdr.P##4.v ++ hdr.P##1.v
#define VALUE_6(P) hdr.P##4.v ++ hdr.P##2.v
#define VALUE_7(P) hdr.P##4.v ++ hdr.P##2.v ++ hdr.P##1.v

/* The command word ended at position I by END (space, cr): its I bytes and the END taken at once, its value from the
 * look */
#define WORD_ENDS(I, END) state word_##END##_##I { \
        pkt.extract(hdr.word_rest, 8 * (I + 1)); meta.s.word = meta.s.look >> (64 - 8 * I); \
        meta.s.remaining = meta.s.remaining - (I + 1); transition word_##END; }
/* The line's last I bytes and its '\r' */
#define LINE_TAIL_ENDS(I) state line_tail_cr_##I { \
        pkt.extract(hdr.line_tail, 8 * (I + 1)); meta.s.remaining = meta.s.remaining - (I + 1); \
        transition line_cr_found; }
/* The next 8 bytes (at most `remaining`, zeros after them) are in meta.s.look: byte I of them is V */
#define IS(V, I) 64w0x##V << (8 * (7 - I)) &&& 64w0xff << (8 * (7 - I))
/* Select entries on a 256-bit lookahead (32 bytes): byte value 0xV at any of the 32 positions goes to `to`. */
#define AT32(v, i) (256w0x##v << (8 * (31 - (i)))) &&& (256w0xff << (8 * (31 - (i))))
#define ANY8_32(v, to, j) AT32(v, j): to; AT32(v, j + 1): to; AT32(v, j + 2): to; AT32(v, j + 3): to; \
                          AT32(v, j + 4): to; AT32(v, j + 5): to; AT32(v, j + 6): to; AT32(v, j + 7): to
#define ANY32_BYTE_IS(v, to) ANY8_32(v, to, 0); ANY8_32(v, to, 8); ANY8_32(v, to, 16); ANY8_32(v, to, 24)
#define LINE_BYTE(I) (_, _, I): accept; (IS(0d, I), _, _): line_tail_cr_##I; \
    (IS(54, I), CMD_READ, _): line_tail_changes; (IS(4e, I), CMD_READ, _): line_tail_changes; \
    (IS(49, I), CMD_READ, _): line_tail_changes;
/* The next 8 bytes into meta.s.look, fewer where the payload has fewer (zeros after them), then on to NEXT: states
 * P_load and P_look_N of their own for each part P that looks (a shared set of states would need one more to go on to
 * the part's next: every parser state costs bmv2 per packet that passes it) */
#define LOOK_N(P, N, NEXT) state P##_look_##N { \
        meta.s.look##N = pkt.lookahead<bit<(8 * N)>>(); meta.s.look = (bit<64>)meta.s.look##N << (64 - 8 * N); \
        transition NEXT; }
#define LOOKS(P, NEXT) \
    state P##_load { \
        transition select(meta.s.remaining) { \
            0: P##_look_0; 1: P##_look_1; 2: P##_look_2; 3: P##_look_3; 4: P##_look_4; 5: P##_look_5; 6: P##_look_6; \
            7: P##_look_7; default: P##_look_8; \
        } \
    } \
    state P##_look_0 { meta.s.look = 0; transition NEXT; } \
    LOOK_N(P, 1, NEXT) LOOK_N(P, 2, NEXT) LOOK_N(P, 3, NEXT) LOOK_N(P, 4, NEXT) LOOK_N(P, 5, NEXT) \
    LOOK_N(P, 6, NEXT) LOOK_N(P, 7, NEXT) \
    state P##_look_8 { meta.s.look = pkt.lookahead<bit<64>>(); transition NEXT; }
/* A transport header's options: a state per length (an extract's length as an expression is a compiler temporary) */
#define IPV4_OPTIONS(W) state ipv4_options_##W { \
        pkt.extract(hdr.ipv4_options, 32 * (W - 5)); \
        meta.s.span = (bit<32>)meta.s.ip_end - (14 + 4 * W + 8);  /* for UDP: ip_end less the UDP header's end */ \
        transition parse_ipv4_protocol; }
#define TCP_OPTIONS(W) state tcp_options_##W { \
        pkt.extract(hdr.tcp_options, 32 * (W - 5)); transition parse_tcp_payload; }
/* Where the payload starts (a select on remaining): the command word, up to 7 bytes, ended by ' ' or '\r'; "get "
 * and "set " in one step (command4) */
#define COMMAND_CASES \
    0: accept;  /* nothing to read: a bare TCP ACK, an empty datagram */ \
    1 &&& 0xfffc: word_load;  /* 1 .. 3 */ \
    default: command4;
/* ... a select on the next 4 bytes where there are 4 */
#define COMMAND4_CASES \
    0x67657420: get4;  /* "get " */ \
    0x73657420: set4;  /* "set " */ \
    default: word_load;
/* Where a command's key starts: meta.k made valid, which zeroes its length and key (bmv2 zeroes every field of a header
 * made valid; a header, not metadata, so that the 2,000 bits are zeroed only where a command has a key); then
 * KEY_FIRST_STEP(P), the state P_key (a state of its own: a select on the state's own assignment copies the key;
 * p4c makes one state of the two, as of every state and its only successor). */
#define KEY_START(P) meta.k.setValid(); transition P##_key;
/* The key's next step where no byte of it is read: its last look (KEY_LAST_LOOK), 8 or 32 bytes at a time */
#define KEY_FIRST_STEP(P) state P##_key { \
        transition select(meta.s.remaining) { \
            0: no_key; 1: key_look_1; 2: key_look_2; 3: key_look_3; 4: key_look_4; 5: key_look_5; 6: key_look_6; \
            7: key_look_7; 0 &&& 0xffe0: key_words_look; default: key32_look_0; \
        } \
    }
/* Entries of a select on (remaining, k.len): fewer than 8 bytes left: the last look takes them all (none: no key) */
#define KEY_LAST_LOOK (0, _): no_key; (1, _): key_look_1; (2, _): key_look_2; (3, _): key_look_3; (4, _): key_look_4; \
    (5, _): key_look_5; (6, _): key_look_6; (7, _): key_look_7;
/* ... 8 or more left: the last look (len > MB_MAX_KEY - 8 (242): 243, 244..247, 248..255) or 8 more bytes */
#define KEY_STEP_CASES KEY_LAST_LOOK (_, 243): key_look_8; (_, 244 &&& 0xfc): key_look_8; \
    (_, 248 &&& 0xf8): key_look_8; default: key_words_look;
/* The key's last look: N bytes into meta.s.F, and the select CASES on (F, k.len) (no end in them: no key) */
#define KEY_LOOK(N, F, CASES) \
    state key_look_##N { meta.s.F = pkt.lookahead<bit<(8 * N)>>(); transition key_look_##N##_is; } \
    state key_look_##N##_is { transition select(meta.s.F, meta.k.len) { CASES default: no_key; } }
/* Byte I of an N-byte look is V */
#define KAT(N, V, I) ((bit<(8 * N)>)0x##V << (8 * (N - 1 - I))) &&& ((bit<(8 * N)>)0xff << (8 * (N - 1 - I)))
/* The key's end at byte I of an N-byte look: ' ' (key_space_I), '\r' (CR: whether a '\n' can follow, and whether
 * the payload ends there, known from N and I), a line end with no '\r' or a NUL (memcached refuses it): no key */
#define KEY_POS(N, I, CR) (KAT(N, 20, I), _): key_space_##I; (KAT(N, 0d, I), _): CR; (KAT(N, 0a, I), _): no_key; \
    (KAT(N, 00, I), _): no_key;
#define KEY_POS0(N, CR) (KAT(N, 20, 0), 0): no_key; (KAT(N, 0d, 0), 0): no_key; KEY_POS(N, 0, CR)  /* empty key */
#define KEY_251 (_, MB_MAX_KEY - 2): no_key;  /* a 251st byte (after 8-byte steps, a long key is 248 bytes) */
/* The key's last I bytes taken and added to it (KEY_TAKE), or, where they are all of it (in the key_first states:
 * after "get " or "set " the key starts with its last look or 8-byte step), made it (KEY_FIRST_TAKE: no shift of
 * 2,000 bits, the length a constant) */
#define KEY_ADD(I) TAKE_##I(key) meta.k.key = (meta.k.key << (8 * I)) | (bit<MB_KEY_BITS>)(VALUE_##I(key)); \
    meta.k.len = meta.k.len + I;
#define KEY_TAKE_0
#define KEY_TAKE_1 KEY_ADD(1)
#define KEY_TAKE_2 KEY_ADD(2)
#define KEY_TAKE_3 KEY_ADD(3)
#define KEY_TAKE_4 KEY_ADD(4)
#define KEY_TAKE_5 KEY_ADD(5)
#define KEY_TAKE_6 KEY_ADD(6)
#define KEY_TAKE_7 KEY_ADD(7)
#define KEY_TAKE(I) KEY_TAKE_##I
#define KEY_FIRST_TAKE(I) TAKE_##I(key) meta.k.key = (bit<MB_KEY_BITS>)(VALUE_##I(key)); meta.k.len = I;
/* The states that take the key's last I bytes (TAKE) and what ends it, named P_*_I; OFF: bytes read that remaining
 * still counts (the key_first states': "get " or "set ", its 4 bytes left to them, an operation less) */
/* ... ' ' (the line's first byte) */
#define KEY_SPACE(P, TAKE, OFF, I) state P##_space_##I { \
        TAKE(I) pkt.extract(hdr.key_end); meta.s.line_len = 1; meta.s.remaining = meta.s.remaining - (I + 1 + OFF); \
        transition select(meta.s.data_field) { \
            MB_NO_DATA: line32;  /* no data length to read: only where '\r' is matters (and mg's flags) */ \
            default: head_start; \
        } \
    }
/* ... '\r' and the byte after it (the '\n' or not: the ingress control checks it), more after them */
#define KEY_CRLF(P, TAKE, OFF, I) state P##_crlf_##I { \
        TAKE(I) pkt.extract(hdr.key_end); pkt.extract(hdr.lf); meta.s.remaining = meta.s.remaining - (I + 2 + OFF); \
        meta.line_found = 1; transition accept; }
/* ... the same, the payload's last bytes */
#define KEY_CRLF_END(P, TAKE, I) state P##_crlf_end_##I { \
        TAKE(I) pkt.extract(hdr.key_end); pkt.extract(hdr.lf); meta.s.remaining = 0; meta.line_found = 1; \
        transition accept; }
/* ... '\r', the payload's last byte (no '\n') */
#define KEY_CR_END(P, TAKE, I) state P##_cr_end_##I { \
        TAKE(I) pkt.extract(hdr.key_end); meta.s.remaining = 0; meta.line_found = 1; transition accept; }
/* ... '\r', the 8th byte of 8 or more: a '\n' may follow */
#define KEY_CR_7(P, TAKE, OFF) state P##_cr_7 { \
        TAKE(7) pkt.extract(hdr.key_end); meta.s.remaining = meta.s.remaining - (8 + OFF); transition line_cr_found; }
/* A key_first look: N bytes into meta.s.F, and the select CASES on F (no end in them: no key; no byte read: a byte
 * that ends the key at its first is no key either) */
#define KEY_FIRST_LOOK(N, F, CASES) \
    state key_first_look_##N { meta.s.F = pkt.lookahead<bit<(8 * N)>>(); transition key_first_look_##N##_is; } \
    state key_first_look_##N##_is { \
        transition select(meta.s.F) { \
            KAT(N, 20, 0): no_key; KAT(N, 0d, 0): no_key; KAT(N, 0a, 0): no_key; KAT(N, 00, 0): no_key; \
            CASES default: no_key; \
        } \
    }
#define KEY_FIRST_POS(N, I, CR) KAT(N, 20, I): key_first_space_##I; KAT(N, 0d, I): CR; KAT(N, 0a, I): no_key; \
    KAT(N, 00, I): no_key;
/* After "get " or "set " (a select on remaining, which counts them): the key's first look (fewer than 8 bytes left:
 * key_first_look_N; 0 or 1: no key), 8 bytes (fewer than 32 left), or 32 at a time (remaining made the bytes left
 * first) */
#define KEY_AFTER_COMMAND4 \
    4: no_key; 5: no_key; 6: key_first_look_2; 7: key_first_look_3; 8: key_first_look_4; 9: key_first_look_5; \
    10: key_first_look_6; 11: key_first_look_7; \
    12 &&& 0xfffc: key_first_words_look; 16 &&& 0xfff0: key_first_words_look; 32 &&& 0xfffc: key_first_words_look; \
    default: key_first_32;
/* Entries of a select on (remaining, line_len, command): line_len is 256 or more (any of its high 8 bits set) */
#define LEN_BIT(b, to) (_, 16w1 << b &&& 16w1 << b, _): to;
#define LINE_LEN_256_UP(to) LEN_BIT(8, to) LEN_BIT(9, to) LEN_BIT(10, to) LEN_BIT(11, to) LEN_BIT(12, to) \
    LEN_BIT(13, to) LEN_BIT(14, to) LEN_BIT(15, to)
/* Entries of a select on (fields, data_field, X): the field being read is the data length (fields - data_field is 1,
 * as entries: an expression is a compiler temporary; data_field is 0, 2 or MB_NO_DATA) and X is K */
#define IN_DATA_LENGTH(K, to) (1, 0, K): to; (3, 2, K): to; (0, MB_NO_DATA, K): to;
#define HEAD_THEN_WIDE 0  /* meta.s.head_then: where the head's end goes on to */
#define HEAD_THEN_CR 1
#define KEY_ENDS_ANY(to) ANY_BYTE_IS(20, to); ANY_BYTE_IS(0d, to); ANY_BYTE_IS(0a, to); ANY_BYTE_IS(00, to)
#define LINE_ENDS_ANY(to) ANY_BYTE_IS(0d, to)
#define MG_ENDS_ANY(to) ANY_BYTE_IS(0d, to); ANY_BYTE_IS(54, to); ANY_BYTE_IS(4e, to); ANY_BYTE_IS(49, to)
#define KEY_ENDS_ANY32(to) ANY32_BYTE_IS(20, to); ANY32_BYTE_IS(0d, to); ANY32_BYTE_IS(0a, to); ANY32_BYTE_IS(00, to)
#define LINE_ENDS_ANY32(to) ANY32_BYTE_IS(0d, to)
#define MG_ENDS_ANY32(to) ANY32_BYTE_IS(0d, to); ANY32_BYTE_IS(54, to); ANY32_BYTE_IS(4e, to); ANY32_BYTE_IS(49, to)
/* A 32-byte stretch P: window N (32 bytes) after the N before it, which were looked at and found clean but not taken
 * (a stack of 32-byte headers, one per window, would be an instance each, which bmv2 resets for every packet): the
 * W = N + 1 windows looked at into meta.s.windowsW, its last 32 bytes into look32, then P_window, the window's
 * select: one state for all N, so that p4c merges it into none of them (merged, its select on look32 would be on a
 * copy). Window 0 is looked at into look32 itself. */
#define WINDOW_LOOK(P, N, W) state P##_look_##N { \
        meta.s.windows##W = pkt.lookahead<bit<(256 * W)>>(); \
        meta.s.look32 = meta.s.windows##W[255:0]; meta.s.step = N; transition P##_window; }
#define WINDOW_LOOKS(P, WIN) \
    state P##_look_0 { meta.s.look32 = pkt.lookahead<bit<256>>(); meta.s.step = 0; transition WIN; } \
    WINDOW_LOOK(P, 1, 2) WINDOW_LOOK(P, 2, 3) WINDOW_LOOK(P, 3, 4) WINDOW_LOOK(P, 4, 5) WINDOW_LOOK(P, 5, 6) \
    WINDOW_LOOK(P, 6, 7)
/* ... the next window (after window `step`, clean) */
#define WINDOW_NEXT(P) \
    state P##_next { \
        transition select(meta.s.step) { \
            0: P##_look_1; 1: P##_look_2; 2: P##_look_3; 3: P##_look_4; 4: P##_look_5; default: P##_look_6; \
        } \
    }
/* ... the stretch's end: its clean windows taken in one extract into hdr.P (a state per length: an extract's length
 * as an expression is a compiler temporary), `step` of them (P_flush: window `step` was not clean) or step + 1
 * (P_flush_next: it was, and the stretch ends after it), then NEXT */
#define FLUSH_N(P, N, NEXT) state P##_flush_##N { pkt.extract(hdr.P, 256 * N); transition NEXT; }
#define FLUSHES(P, NEXT) \
    state P##_flush { \
        transition select(meta.s.step) { \
            0: NEXT; 1: P##_flush_1; 2: P##_flush_2; 3: P##_flush_3; 4: P##_flush_4; 5: P##_flush_5; \
            default: P##_flush_6; \
        } \
    } \
    state P##_flush_next { \
        transition select(meta.s.step) { \
            0: P##_flush_1; 1: P##_flush_2; 2: P##_flush_3; 3: P##_flush_4; 4: P##_flush_5; 5: P##_flush_6; \
            default: P##_flush_7; \
        } \
    } \
    FLUSH_N(P, 1, NEXT) FLUSH_N(P, 2, NEXT) FLUSH_N(P, 3, NEXT) FLUSH_N(P, 4, NEXT) FLUSH_N(P, 5, NEXT) \
    FLUSH_N(P, 6, NEXT) FLUSH_N(P, 7, NEXT)

parser MbParser(packet_in pkt, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    state start {
        meta.s.data_field = MB_NO_DATA;
        transition select(std.ingress_port) {
            MB_CPU_PORT: parse_packet_out;
            default: parse_ethernet;
        }
    }

    state parse_packet_out {
        pkt.extract(hdr.packet_out);
        transition accept;
    }

    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x0800: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        meta.s.ip_end = 14 + hdr.ipv4.total_len;
        /* (without options, the protocol's select too where it is an unfragmented packet's: a state less) */
        transition select(hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.flags_frag, hdr.ipv4.protocol) {
            (4, 5, 0 &&& 0x3fff, 17): parse_udp5;
            (4, 5, 0 &&& 0x3fff, 6): parse_tcp;
            (4, 5, _, _): parse_ipv4_protocol;
            (4, 0 &&& 0xc, _, _): accept;   /* ihl 0..3: broken */
            (4, 4, _, _): accept;
            (4, _, _, _): parse_ipv4_options;
            default: accept;
        }
    }

    state parse_ipv4_options {
        transition select(hdr.ipv4.ihl) {
            6: ipv4_options_6; 7: ipv4_options_7; 8: ipv4_options_8; 9: ipv4_options_9; 10: ipv4_options_10;
            11: ipv4_options_11; 12: ipv4_options_12; 13: ipv4_options_13; 14: ipv4_options_14;
            default: ipv4_options_15;
        }
    }
    IPV4_OPTIONS(6) IPV4_OPTIONS(7) IPV4_OPTIONS(8) IPV4_OPTIONS(9) IPV4_OPTIONS(10) IPV4_OPTIONS(11)
    IPV4_OPTIONS(12) IPV4_OPTIONS(13) IPV4_OPTIONS(14) IPV4_OPTIONS(15)

    state parse_ipv4_protocol {
        /* a later fragment has no transport header; a first one (more fragments) only its ports */
        transition select(hdr.ipv4.flags_frag, hdr.ipv4.protocol) {  /* (masks: a select on an expression is on a
                                                                       * compiler temporary) */
            (0 &&& 0x3fff, 17): parse_udp;
            (0 &&& 0x3fff, 6): parse_tcp;
            (0x2000 &&& 0x3fff, 17): parse_first_fragment;
            (0x2000 &&& 0x3fff, 6): parse_first_fragment;
            default: accept;
        }
    }

    state parse_first_fragment {
        pkt.extract(hdr.ports);
        meta.first_fragment = 1;
        transition accept;
    }

    /* UDP without IPv4 options: the header lengths constants (a short expression for bmv2 to evaluate). Where the
     * IPv4 packet ends inside the UDP header (ip_end < 14 + 20 + 8), or before a frame header's end (< 8 more): as
     * entries on ip_end (not on payload_len: p4c would copy this state's assignment into a compiler temporary, as a
     * comparison would be one) */
    state parse_udp5 {
        pkt.extract(hdr.ports);
        pkt.extract(hdr.udp);
        meta.s.payload_len = hdr.ipv4.total_len - (20 + 8);
        transition select(meta.s.ip_end) {
            0 &&& 0xffe0: udp_short;   /* ip_end < 50: 0..31, */
            32 &&& 0xfff0: udp_short;  /* ... 32..47, */
            48 &&& 0xfffe: udp_short;  /* ... 48..49 */
            default: parse_frame;
        }
    }

    state udp_short {
        transition select(meta.s.ip_end) {
            0 &&& 0xffe0: accept;   /* ip_end < 42: 0..31, */
            32 &&& 0xfff8: accept;  /* ... 32..39, */
            40 &&& 0xfffe: accept;  /* ... 40..41 */
            default: udp_no_frame;
        }
    }

    /* UDP after IPv4 options (only: parse_ipv4 sends any other to parse_udp5): the same from the sign of span, set
     * by IPV4_OPTIONS, and from payload_len (in a state of its own) */
    state parse_udp {
        pkt.extract(hdr.ports);
        pkt.extract(hdr.udp);
        meta.s.payload_len = meta.s.ip_end - 14 - ((bit<16>)hdr.ipv4.ihl << 2) - 8;
        transition select(meta.s.span) {
            0x80000000 &&& 0x80000000: accept;
            default: udp_frame_room;
        }
    }

    state udp_frame_room {
        transition select(meta.s.payload_len) {
            0 &&& 0xfff8: udp_no_frame;  /* shorter than a frame header (0..7) */
            default: parse_frame;
        }
    }

    state udp_no_frame {
        meta.l4 = 1;
        meta.s.remaining = meta.s.payload_len;
        transition accept;
    }

    state parse_frame {
        pkt.extract(hdr.frame);
        meta.l4 = 1;
        meta.s.remaining = meta.s.payload_len - 8;
        transition select(hdr.frame.sequence, hdr.frame.datagrams, meta.s.payload_len) {
            (0, 1, 8 &&& 0xfffc): frame_ok;  /* sequence 0 of 1 datagram, 0..3 bytes after it */
            (0, 1, _): frame_command4;       /* ... 4 or more: parse_command's choice made here (a state less) */
            default: frame_other;
        }
    }

    /* (command_len set here, not where remaining is: p4c would make it remaining's expression, an operation more) */
    state frame_command4 {
        meta.frame_ok = 1;
        meta.s.command_len = meta.s.remaining;
        meta.s.look4 = pkt.lookahead<bit<32>>();
        transition select(meta.s.look4) { COMMAND4_CASES }
    }

    state frame_ok {
        meta.frame_ok = 1;
        meta.s.command_len = meta.s.remaining;
        transition select(meta.s.remaining) { COMMAND_CASES }
    }

    state frame_other {
        meta.s.command_len = meta.s.remaining;
        transition accept;
    }

    state parse_tcp {
        pkt.extract(hdr.ports);
        pkt.extract(hdr.tcp);
        /* (for parse_tcp_payload's select: in its own state, p4c would copy it into a compiler temporary) */
        meta.s.span = (bit<32>)meta.s.ip_end -
            (bit<32>)(14 + ((bit<16>)hdr.ipv4.ihl << 2) + ((bit<16>)hdr.tcp.data_offset << 2));
        transition select(hdr.tcp.data_offset) {
            0 &&& 0xc: accept;  /* 0..3: broken */
            4: accept;
            5: parse_tcp_payload;
            default: parse_tcp_options;
        }
    }

    state parse_tcp_options {  /* (as the IPv4 options) */
        transition select(hdr.tcp.data_offset) {
            6: tcp_options_6; 7: tcp_options_7; 8: tcp_options_8; 9: tcp_options_9; 10: tcp_options_10;
            11: tcp_options_11; 12: tcp_options_12; 13: tcp_options_13; 14: tcp_options_14;
            default: tcp_options_15;
        }
    }
    TCP_OPTIONS(6) TCP_OPTIONS(7) TCP_OPTIONS(8) TCP_OPTIONS(9) TCP_OPTIONS(10) TCP_OPTIONS(11)
    TCP_OPTIONS(12) TCP_OPTIONS(13) TCP_OPTIONS(14) TCP_OPTIONS(15)

    state parse_tcp_payload {
        meta.s.payload_len = meta.s.ip_end - (14 + ((bit<16>)hdr.ipv4.ihl << 2) + ((bit<16>)hdr.tcp.data_offset << 2));
        transition select(meta.s.span) {
            0x80000000 &&& 0x80000000: tcp_short;  /* the IPv4 packet ends inside the TCP header */
            default: tcp_ok;
        }
    }

    /* (remaining and command_len set in the next state: here p4c would make each payload_len's expression) */
    state tcp_short {
        meta.s.remaining = meta.s.payload_len;
        meta.s.command_len = meta.s.payload_len;
        transition accept;
    }

    state tcp_ok {
        meta.l4 = 1;
        meta.s.remaining = meta.s.payload_len;
        meta.s.command_len = meta.s.payload_len;
        transition select(meta.s.payload_len) { COMMAND_CASES }
    }

    state command4 {
        meta.s.look4 = pkt.lookahead<bit<32>>();
        transition select(meta.s.look4) { COMMAND4_CASES }
    }

    state get4 {  /* (get's statements here: a state less for most gets) */
        pkt.extract(hdr.command4);
        meta.command = CMD_GET;
        meta.k.setValid();  /* (KEY_START) */
        transition select(meta.s.remaining) { KEY_AFTER_COMMAND4 }
    }

    state set4 {
        pkt.extract(hdr.command4);
        meta.command = CMD_WRITE;
        meta.s.data_field = 2;
        meta.k.setValid();
        transition select(meta.s.remaining) { KEY_AFTER_COMMAND4 }
    }

    LOOKS(word, word_look)

    /* Up to 7 bytes, ended by ' ' or '\r' (the first in the look: entries in order of position) */
    state word_look {
        transition select(meta.s.look) {
            IS(20, 0): word_space_0; IS(0d, 0): word_cr_0;
            IS(20, 1): word_space_1; IS(0d, 1): word_cr_1;
            IS(20, 2): word_space_2; IS(0d, 2): word_cr_2;
            IS(20, 3): word_space_3; IS(0d, 3): word_cr_3;
            IS(20, 4): word_space_4; IS(0d, 4): word_cr_4;
            IS(20, 5): word_space_5; IS(0d, 5): word_cr_5;
            IS(20, 6): word_space_6; IS(0d, 6): word_cr_6;
            IS(20, 7): word_space_7; IS(0d, 7): word_cr_7;
            default: command_other;  /* no end, or too long for any command */
        }
    }

    /* no word (meta.s.word is not zeroed per packet) */
    state word_space_0 { pkt.extract(hdr.word_rest, 8); meta.s.word = 0; meta.s.remaining = meta.s.remaining - 1;
        transition word_space; }
    state word_cr_0 { pkt.extract(hdr.word_rest, 8); meta.s.word = 0; meta.s.remaining = meta.s.remaining - 1;
        transition word_cr; }
    WORD_ENDS(1, space) WORD_ENDS(2, space) WORD_ENDS(3, space) WORD_ENDS(4, space) WORD_ENDS(5, space)
    WORD_ENDS(6, space) WORD_ENDS(7, space)
    WORD_ENDS(1, cr) WORD_ENDS(2, cr) WORD_ENDS(3, cr) WORD_ENDS(4, cr) WORD_ENDS(5, cr) WORD_ENDS(6, cr)
    WORD_ENDS(7, cr)

    state command_other {
        meta.command = CMD_OTHER;
        transition accept;
    }

    state word_space {
        transition select(meta.s.word) {
            0x676574: get;                        /* get */
            0x67657473: get;                      /* gets */
            0x736574: write_data_2;               /* set <key> <flags> <exptime> <bytes> [noreply] */
            0x616464: write_data_2;               /* add */
            0x636173: write_data_2;               /* cas */
            0x7265706c616365: write_data_2;       /* replace */
            0x617070656e64: write_data_2;         /* append */
            0x70726570656e64: write_data_2;       /* prepend */
            0x64656c657465: write_no_data;        /* delete */
            0x696e6372: write_no_data;            /* incr */
            0x64656372: write_no_data;            /* decr */
            0x746f756368: write_no_data;          /* touch */
            0x6d73: write_data_0;                 /* ms <key> <datalen> <flags>* */
            0x6d64: write_no_data;                /* md */
            0x6d61: write_no_data;                /* ma */
            0x6d67: meta_get;                     /* mg */
            0x7374617473: line_after_space;       /* stats <args> */
            0x76657273696f6e: line_after_space;   /* version <...> */
            default: command_other;
        }
    }

    state word_cr {
        transition select(meta.s.word) {
            0x7374617473: line_after_cr;          /* stats */
            0x76657273696f6e: line_after_cr;      /* version */
            0x6d6e: noop;                         /* mn */
            default: command_other;
        }
    }

    state get { meta.command = CMD_GET; KEY_START(get) } KEY_FIRST_STEP(get)
    state meta_get { meta.command = CMD_READ; KEY_START(meta_get) } KEY_FIRST_STEP(meta_get)
    state write_data_2 { meta.command = CMD_WRITE; meta.s.data_field = 2; KEY_START(write_data_2) }
    KEY_FIRST_STEP(write_data_2)
    state write_data_0 { meta.command = CMD_WRITE; meta.s.data_field = 0; KEY_START(write_data_0) }
    KEY_FIRST_STEP(write_data_0)
    state write_no_data { meta.command = CMD_WRITE; KEY_START(write_no_data) } KEY_FIRST_STEP(write_no_data)
    state line_after_space { meta.command = CMD_LINE; meta.s.line_len = 1; transition head_start; }
    state line_after_cr { meta.command = CMD_LINE; transition line_cr_found; }
    state noop { meta.command = CMD_NOOP; transition line_cr_found; }

    /* The key as memcached's text protocol reads it: 1..250 bytes, any but space, '\r', '\n' and NUL (control
     * characters included), ended by ' ' or '\r'; anything else: no key (key_len 0). 32 bytes at a time, then 8,
     * while none of them is one of those and the key stays within 250 bytes; then its last bytes (the key ends
     * within the next 8 bytes, or the packet does, or the 250 bytes are near). The key starts (KEY_START) in the
     * state that read the command; each state that moves on in the key chooses the next step itself (KEY_FIRST,
     * KEY32_STEP, KEY_STEP: a state less per step), down to how many bytes the last look takes. */

    /* The key's first 224 bytes at most: 32 at a time (WINDOW_LOOKS), taken where the stretch ends (FLUSHES);
     * `remaining` counts the bytes not looked at yet, so the next window is within the payload where it is 32 or
     * more. */
    WINDOW_LOOKS(key32, key32_window)

    state key32_window {  /* (no end in the 32 bytes: key32_take; else 8 at a time from here, never 32 again: the
                           * key's bytes stay in order) */
        transition select(meta.s.look32) {
            KEY_ENDS_ANY32(key32_flush);
            default: key32_take;
        }
    }

    state key32_take {
        meta.k.key = (meta.k.key << 256) | (bit<MB_KEY_BITS>)meta.s.look32;
        meta.k.len = meta.k.len + 32;
        meta.s.remaining = meta.s.remaining - 32;
        transition key32_step;
    }

    /* (key32_take's select, a state of its own: one on the state's own assignment copies the key) 32 more bytes in
     * the payload and the key stays within MB_MAX_KEY: the next window; else the stretch ends (and key32_end goes
     * on as KEY_STEP_CASES). As masks: a select on an expression is on a compiler temporary. */
    state key32_step {
        transition select(meta.s.remaining, meta.k.len) {
            (0 &&& 0xffe0, _): key32_flush_next;  /* remaining < 32, */
            (_, 219): key32_flush_next;           /* len > MB_MAX_KEY - 32 (218): 219, */
            (_, 220 &&& 0xfc): key32_flush_next;  /* ... 220..223, */
            (_, 224 &&& 0xe0): key32_flush_next;  /* ... 224..255 */
            default: key32_next;
        }
    }

    WINDOW_NEXT(key32)
    FLUSHES(key32, key32_end)

    state key32_end {  /* the last look (KEY_LAST_LOOK, or the 251st byte near: key_look_8), or 8 more bytes */
        transition select(meta.s.remaining, meta.k.len) {
            KEY_STEP_CASES
        }
    }

    state key_words_look {
        meta.s.look = pkt.lookahead<bit<64>>();
        transition key_words_look_is;
    }

    state key_words_look_is {  /* (a select of its own: one on the state's own assignment copies the key) */
        transition select(meta.s.look) {
            KEY_ENDS_ANY(key_look_8);  /* (8 or more bytes left here) */
            default: key_take_word;
        }
    }

    state key_take_word {
        pkt.extract(hdr.key_words.next);
        meta.k.key = (meta.k.key << 64) | (bit<MB_KEY_BITS>)hdr.key_words.last.w;
        meta.k.len = meta.k.len + 8;
        meta.s.remaining = meta.s.remaining - 8;
        transition key_take_word_step;
    }

    state key_take_word_step {  /* (key_take_word's select, a state of its own: see key32_step) */
        transition select(meta.s.remaining, meta.k.len) {
            KEY_STEP_CASES
        }
    }

    /* The last bytes: the one that ends the key is within the next N (N: 8, or the bytes left where fewer; or the
     * 251st byte is). The N bytes are looked at as they are (key_look_N: a select on a field of N bytes), not
     * widened to 8 (an operation more); the first of them that ends the key, in order of position, ' ' or '\r',
     * chooses the state that takes the key's last bytes and that one, and knows (from N) whether a '\n' can
     * follow a '\r' and whether the payload ends there (past the packet's end: no key, as memcached refuses a
     * NUL). */
    KEY_LOOK(1, look1, KEY_POS0(1, key_cr_end_0))
    KEY_LOOK(2, look2, KEY_POS0(2, key_crlf_end_0) KEY_POS(2, 1, key_cr_end_1))
    KEY_LOOK(3, look3, KEY_POS0(3, key_crlf_0) KEY_POS(3, 1, key_crlf_end_1) KEY_POS(3, 2, key_cr_end_2))
    KEY_LOOK(4, look4, KEY_POS0(4, key_crlf_0) KEY_POS(4, 1, key_crlf_1) KEY_POS(4, 2, key_crlf_end_2) KEY_251
        KEY_POS(4, 3, key_cr_end_3))
    KEY_LOOK(5, look5, KEY_POS0(5, key_crlf_0) KEY_POS(5, 1, key_crlf_1) KEY_POS(5, 2, key_crlf_2) KEY_251
        KEY_POS(5, 3, key_crlf_end_3) KEY_POS(5, 4, key_cr_end_4))
    KEY_LOOK(6, look6, KEY_POS0(6, key_crlf_0) KEY_POS(6, 1, key_crlf_1) KEY_POS(6, 2, key_crlf_2) KEY_251
        KEY_POS(6, 3, key_crlf_3) KEY_POS(6, 4, key_crlf_end_4) KEY_POS(6, 5, key_cr_end_5))
    KEY_LOOK(7, look7, KEY_POS0(7, key_crlf_0) KEY_POS(7, 1, key_crlf_1) KEY_POS(7, 2, key_crlf_2) KEY_251
        KEY_POS(7, 3, key_crlf_3) KEY_POS(7, 4, key_crlf_4) KEY_POS(7, 5, key_crlf_end_5) KEY_POS(7, 6, key_cr_end_6))
    KEY_LOOK(8, look, KEY_POS0(8, key_crlf_0) KEY_POS(8, 1, key_crlf_1) KEY_POS(8, 2, key_crlf_2) KEY_251
        KEY_POS(8, 3, key_crlf_3) KEY_POS(8, 4, key_crlf_4) KEY_POS(8, 5, key_crlf_5) KEY_POS(8, 6, key_crlf_6)
        KEY_POS(8, 7, key_cr_7))

    KEY_SPACE(key, KEY_TAKE, 0, 0) KEY_SPACE(key, KEY_TAKE, 0, 1) KEY_SPACE(key, KEY_TAKE, 0, 2)
    KEY_SPACE(key, KEY_TAKE, 0, 3) KEY_SPACE(key, KEY_TAKE, 0, 4) KEY_SPACE(key, KEY_TAKE, 0, 5)
    KEY_SPACE(key, KEY_TAKE, 0, 6) KEY_SPACE(key, KEY_TAKE, 0, 7)
    KEY_CRLF(key, KEY_TAKE, 0, 0) KEY_CRLF(key, KEY_TAKE, 0, 1) KEY_CRLF(key, KEY_TAKE, 0, 2)
    KEY_CRLF(key, KEY_TAKE, 0, 3) KEY_CRLF(key, KEY_TAKE, 0, 4) KEY_CRLF(key, KEY_TAKE, 0, 5)
    KEY_CRLF(key, KEY_TAKE, 0, 6)
    KEY_CRLF_END(key, KEY_TAKE, 0) KEY_CRLF_END(key, KEY_TAKE, 1) KEY_CRLF_END(key, KEY_TAKE, 2)
    KEY_CRLF_END(key, KEY_TAKE, 3) KEY_CRLF_END(key, KEY_TAKE, 4) KEY_CRLF_END(key, KEY_TAKE, 5)
    KEY_CR_END(key, KEY_TAKE, 0) KEY_CR_END(key, KEY_TAKE, 1) KEY_CR_END(key, KEY_TAKE, 2) KEY_CR_END(key, KEY_TAKE, 3)
    KEY_CR_END(key, KEY_TAKE, 4) KEY_CR_END(key, KEY_TAKE, 5) KEY_CR_END(key, KEY_TAKE, 6)
    KEY_CR_7(key, KEY_TAKE, 0)

    /* The key after "get " or "set ": its first look, first 8 bytes, or 32 at a time */
    KEY_FIRST_LOOK(2, look2, KEY_FIRST_POS(2, 1, key_first_cr_end_1))
    KEY_FIRST_LOOK(3, look3, KEY_FIRST_POS(3, 1, key_first_crlf_end_1) KEY_FIRST_POS(3, 2, key_first_cr_end_2))
    KEY_FIRST_LOOK(4, look4, KEY_FIRST_POS(4, 1, key_first_crlf_1) KEY_FIRST_POS(4, 2, key_first_crlf_end_2)
        KEY_FIRST_POS(4, 3, key_first_cr_end_3))
    KEY_FIRST_LOOK(5, look5, KEY_FIRST_POS(5, 1, key_first_crlf_1) KEY_FIRST_POS(5, 2, key_first_crlf_2)
        KEY_FIRST_POS(5, 3, key_first_crlf_end_3) KEY_FIRST_POS(5, 4, key_first_cr_end_4))
    KEY_FIRST_LOOK(6, look6, KEY_FIRST_POS(6, 1, key_first_crlf_1) KEY_FIRST_POS(6, 2, key_first_crlf_2)
        KEY_FIRST_POS(6, 3, key_first_crlf_3) KEY_FIRST_POS(6, 4, key_first_crlf_end_4)
        KEY_FIRST_POS(6, 5, key_first_cr_end_5))
    KEY_FIRST_LOOK(7, look7, KEY_FIRST_POS(7, 1, key_first_crlf_1) KEY_FIRST_POS(7, 2, key_first_crlf_2)
        KEY_FIRST_POS(7, 3, key_first_crlf_3) KEY_FIRST_POS(7, 4, key_first_crlf_4)
        KEY_FIRST_POS(7, 5, key_first_crlf_end_5) KEY_FIRST_POS(7, 6, key_first_cr_end_6))
    KEY_FIRST_LOOK(8, look, KEY_FIRST_POS(8, 1, key_first_crlf_1) KEY_FIRST_POS(8, 2, key_first_crlf_2)
        KEY_FIRST_POS(8, 3, key_first_crlf_3) KEY_FIRST_POS(8, 4, key_first_crlf_4)
        KEY_FIRST_POS(8, 5, key_first_crlf_5) KEY_FIRST_POS(8, 6, key_first_crlf_6) KEY_FIRST_POS(8, 7, key_first_cr_7))

    KEY_SPACE(key_first, KEY_FIRST_TAKE, 4, 1) KEY_SPACE(key_first, KEY_FIRST_TAKE, 4, 2)
    KEY_SPACE(key_first, KEY_FIRST_TAKE, 4, 3) KEY_SPACE(key_first, KEY_FIRST_TAKE, 4, 4)
    KEY_SPACE(key_first, KEY_FIRST_TAKE, 4, 5) KEY_SPACE(key_first, KEY_FIRST_TAKE, 4, 6)
    KEY_SPACE(key_first, KEY_FIRST_TAKE, 4, 7)
    KEY_CRLF(key_first, KEY_FIRST_TAKE, 4, 1) KEY_CRLF(key_first, KEY_FIRST_TAKE, 4, 2)
    KEY_CRLF(key_first, KEY_FIRST_TAKE, 4, 3) KEY_CRLF(key_first, KEY_FIRST_TAKE, 4, 4)
    KEY_CRLF(key_first, KEY_FIRST_TAKE, 4, 5) KEY_CRLF(key_first, KEY_FIRST_TAKE, 4, 6)
    KEY_CRLF_END(key_first, KEY_FIRST_TAKE, 1) KEY_CRLF_END(key_first, KEY_FIRST_TAKE, 2)
    KEY_CRLF_END(key_first, KEY_FIRST_TAKE, 3) KEY_CRLF_END(key_first, KEY_FIRST_TAKE, 4)
    KEY_CRLF_END(key_first, KEY_FIRST_TAKE, 5)
    KEY_CR_END(key_first, KEY_FIRST_TAKE, 1) KEY_CR_END(key_first, KEY_FIRST_TAKE, 2)
    KEY_CR_END(key_first, KEY_FIRST_TAKE, 3) KEY_CR_END(key_first, KEY_FIRST_TAKE, 4)
    KEY_CR_END(key_first, KEY_FIRST_TAKE, 5) KEY_CR_END(key_first, KEY_FIRST_TAKE, 6)
    KEY_CR_7(key_first, KEY_FIRST_TAKE, 4)

    state key_first_words_look {
        meta.s.look = pkt.lookahead<bit<64>>();
        transition key_first_words_look_is;
    }

    state key_first_words_look_is {  /* (a select of its own: one on the state's own assignment copies the key) */
        transition select(meta.s.look) {
            KEY_ENDS_ANY(key_first_look_8);
            default: key_first_take_word;
        }
    }

    state key_first_take_word {
        pkt.extract(hdr.key_words.next);
        meta.k.key = (bit<MB_KEY_BITS>)hdr.key_words.last.w;
        meta.k.len = 8;
        meta.s.remaining = meta.s.remaining - (8 + 4);
        transition key_first_take_word_step;
    }

    state key_first_take_word_step {  /* (key_first_take_word's select, a state of its own: see key32_step; on
                                        * remaining only: on len, just set to 8, it would be on the constant, and
                                        * bmv2 took no table entries with that) */
        transition select(meta.s.remaining) {
            0: no_key; 1: key_look_1; 2: key_look_2; 3: key_look_3; 4: key_look_4; 5: key_look_5; 6: key_look_6;
            7: key_look_7; default: key_words_look;
        }
    }

    state key_first_32 {
        meta.s.remaining = meta.s.remaining - 4;
        transition key32_look_0;
    }

    state no_key {
        meta.k.len = 0;
        transition accept;
    }

    /* The rest of the line (the byte that ended the key counts as its first): fields, the data length, the flags
     * that make a meta command change the item, and where '\r' is. A byte at a time up to the data length's end
     * (MB_LINE_HEAD bytes at most: past that the line is not proved whole), then 32 or 8 at a time (line32). The
     * bytes are read from the look (meta.s.look, shifted a byte at a time; meta.s.head_at of its 8 read) and taken
     * 8 at a time when it is all read, the rest (and the byte that ends the head) in chunks where the head ends. */
    state head_start {
        meta.s.head_at = 0;
        meta.s.in_field = 0;
        meta.s.digits = 0;
        transition head_load;
    }

    state line_byte {
        transition select(meta.s.remaining, meta.s.line_len, meta.s.head_at) {
            (0, _, _): accept;                      /* no '\r' */
            (_, MB_LINE_HEAD, _): accept;           /* a head longer than any data length field needs */
            (_, _, 8): head_word;                   /* the look is read: take it, look again */
            default: line_byte_look;
        }
    }

    state head_word {
        pkt.extract(hdr.head_words.next);
        meta.s.head_at = 0;
        transition head_load;
    }

    LOOKS(head, line_byte)

    state line_byte_look {
        transition select(meta.s.look) {
            IS(0d, 0): line_cr;
            IS(20, 0): line_space;
            default: line_char;
        }
    }

    /* The head's bytes read but not taken (and the one that ends it), taken; then on to meta.s.head_then */
    state head_end {
        transition select(meta.s.head_at) {
            1: head_end_1; 2: head_end_2; 3: head_end_3; 4: head_end_4; 5: head_end_5; 6: head_end_6; 7: head_end_7;
            8: head_end_8;
            default: head_then;
        }
    }
    state head_end_1 { pkt.extract(hdr.head_rest, 8 * 1); transition head_then; }
    state head_end_2 { pkt.extract(hdr.head_rest, 8 * 2); transition head_then; }
    state head_end_3 { pkt.extract(hdr.head_rest, 8 * 3); transition head_then; }
    state head_end_4 { pkt.extract(hdr.head_rest, 8 * 4); transition head_then; }
    state head_end_5 { pkt.extract(hdr.head_rest, 8 * 5); transition head_then; }
    state head_end_6 { pkt.extract(hdr.head_rest, 8 * 6); transition head_then; }
    state head_end_7 { pkt.extract(hdr.head_rest, 8 * 7); transition head_then; }
    state head_end_8 { pkt.extract(hdr.head_words.next); transition head_then; }
    state head_then {
        transition select(meta.s.head_then) {
            HEAD_THEN_WIDE: line32;
            default: line_cr_found;
        }
    }

    state line_space {
        meta.s.look = meta.s.look << 8;
        meta.s.head_at = meta.s.head_at + 1;
        meta.s.line_len = meta.s.line_len + 1;
        meta.s.remaining = meta.s.remaining - 1;
        transition select(meta.fields, meta.s.data_field, meta.s.in_field) {
            IN_DATA_LENGTH(1, line_data_length_read)  /* the space after the data length */
            default: line_out_of_field;
        }
    }

    state line_out_of_field {
        meta.s.in_field = 0;
        transition line_byte;
    }

    state line_data_length_read {
        meta.s.in_field = 0;
        meta.s.head_then = HEAD_THEN_WIDE;
        transition head_end;
    }

    /* After the data length: 32 bytes at a time, then 8, while none of them is '\r' (nor, for mg, T, N or I) and
     * the line stays within MB_LINE_BYTES; then its last bytes. */
    state line32 {
        transition select(meta.s.remaining, meta.s.line_len, meta.command) {  /* (as masks, as key32_step) */
            (0 &&& 0xffe0, _, _): line_wide;        /* remaining < 32 */
            (_, 225, _): line_wide;                 /* line_len > MB_LINE_BYTES - 32 (224): 225, */
            (_, 226 &&& 0xfffe, _): line_wide;      /* ... 226..227, */
            (_, 228 &&& 0xfffc, _): line_wide;      /* ... 228..231, */
            (_, 232 &&& 0xfff8, _): line_wide;      /* ... 232..239, */
            (_, 240 &&& 0xfff0, _): line_wide;      /* ... 240..255, */
            LINE_LEN_256_UP(line_wide)              /* ... 256 and more */
            (_, _, CMD_READ): line32_mg_look_0;
            default: line32_look_0;
        }
    }

    /* (as the key's: windows looked at, taken where the stretch ends; for mg, T, N or I end it too) */
    WINDOW_LOOKS(line32, line32_window)
    WINDOW_LOOKS(line32_mg, line32_mg_window)

    state line32_window {
        transition select(meta.s.look32) {
            LINE_ENDS_ANY32(line32_flush);
            default: line32_take;
        }
    }

    state line32_mg_window {
        transition select(meta.s.look32) {
            MG_ENDS_ANY32(line32_flush);
            default: line32_take;
        }
    }

    state line32_take {
        meta.s.line_len = meta.s.line_len + 32;
        meta.s.remaining = meta.s.remaining - 32;
        transition line32_step;
    }

    state line32_step {  /* (line32's choice after a window, a state of its own: see key32_step) */
        transition select(meta.s.remaining, meta.s.line_len, meta.command) {
            (0 &&& 0xffe0, _, _): line32_flush_next;
            (_, 225, _): line32_flush_next;
            (_, 226 &&& 0xfffe, _): line32_flush_next;
            (_, 228 &&& 0xfffc, _): line32_flush_next;
            (_, 232 &&& 0xfff8, _): line32_flush_next;
            (_, 240 &&& 0xfff0, _): line32_flush_next;
            LINE_LEN_256_UP(line32_flush_next)
            (_, _, CMD_READ): line32_mg_next;
            default: line32_next;
        }
    }

    WINDOW_NEXT(line32)
    WINDOW_NEXT(line32_mg)
    FLUSHES(line32, line_wide)

    state line_wide {  /* 8 at a time from here (never 32 again: the bytes stay in order) */
        transition select(meta.s.remaining, meta.s.line_len, meta.command) {
            (0 &&& 0xfff8, _, _): line_tail;        /* remaining < 8 */
            (_, 249, _): line_tail;                 /* line_len > MB_LINE_BYTES - 8 (248): 249, */
            (_, 250 &&& 0xfffe, _): line_tail;      /* ... 250..251, */
            (_, 252 &&& 0xfffc, _): line_tail;      /* ... 252..255, */
            LINE_LEN_256_UP(line_tail)              /* ... 256 and more */
            (_, _, CMD_READ): line_words_look_mg;
            default: line_words_look;
        }
    }

    state line_words_look {
        meta.s.look = pkt.lookahead<bit<64>>();
        transition line_words_look_is;
    }

    state line_words_look_is {  /* (a select of its own: one on the state's own assignment copies the key) */
        transition select(meta.s.look) {
            LINE_ENDS_ANY(line_tail);
            default: line_take_word;
        }
    }

    state line_words_look_mg {
        meta.s.look = pkt.lookahead<bit<64>>();
        transition line_words_look_mg_is;
    }

    state line_words_look_mg_is {  /* (a select of its own: one on the state's own assignment copies the key) */
        transition select(meta.s.look) {
            MG_ENDS_ANY(line_tail);
            default: line_take_word;
        }
    }

    state line_take_word {
        pkt.extract(hdr.line_words.next);
        meta.s.line_len = meta.s.line_len + 8;
        meta.s.remaining = meta.s.remaining - 8;
        transition line_wide;
    }

    /* At most 8 bytes: '\r' (or the packet's end, or MB_LINE_BYTES) is within them, or for mg a T, N or I, which
     * makes it change the item whatever follows (so it cannot be whole: nothing more to read). */
    state line_tail {
        meta.s.line_left = MB_LINE_BYTES - meta.s.line_len;
        transition line_load;
    }

    LOOKS(line, line_tail_look)

    /* The first byte of the look, in order of position, past MB_LINE_BYTES (not proved whole), '\r', or for mg a
     * T, N or I (it changes the item: nothing more to read); none (the packet's end): not proved whole */
    state line_tail_look {
        transition select(meta.s.look, meta.command, meta.s.line_left) {
            LINE_BYTE(0) LINE_BYTE(1) LINE_BYTE(2) LINE_BYTE(3) LINE_BYTE(4) LINE_BYTE(5) LINE_BYTE(6) LINE_BYTE(7)
            default: accept;
        }
    }

    LINE_TAIL_ENDS(0) LINE_TAIL_ENDS(1) LINE_TAIL_ENDS(2) LINE_TAIL_ENDS(3) LINE_TAIL_ENDS(4) LINE_TAIL_ENDS(5)
    LINE_TAIL_ENDS(6) LINE_TAIL_ENDS(7)

    state line_tail_changes {
        meta.changes = 1;
        transition accept;
    }

    state line_char {
        meta.s.head_byte = meta.s.look[63:56];
        meta.s.look = meta.s.look << 8;
        meta.s.head_at = meta.s.head_at + 1;
        meta.s.line_len = meta.s.line_len + 1;
        meta.s.remaining = meta.s.remaining - 1;
        transition select(meta.s.in_field) {
            0: line_field_starts;
            default: line_flags;
        }
    }

    state line_field_starts {
        meta.s.in_field = 1;
        meta.fields = meta.fields + 1;
        transition line_flags;
    }

    state line_flags {
        transition select(meta.s.head_byte) {
            0x54: line_changes;  /* T */
            0x4e: line_changes;  /* N */
            0x49: line_changes;  /* I */
            default: line_number;
        }
    }

    state line_changes {
        meta.changes = 1;
        transition line_number;
    }

    /* In the data-length field: digits only, at most 9 of them (more could not fit in a packet anyway). */
    state line_number {
        transition select(meta.fields, meta.s.data_field, meta.s.head_byte) {
            IN_DATA_LENGTH(0x30 &&& 0xf8, line_digit)  /* 0..7 */
            IN_DATA_LENGTH(0x38 &&& 0xfe, line_digit)  /* 8, 9 */
            IN_DATA_LENGTH(_, line_bad_number)
            default: line_byte;
        }
    }

    state line_digit {
        meta.number = meta.number * 10 + (bit<64>)(meta.s.head_byte - 0x30);
        meta.s.digits = meta.s.digits + 1;
        transition select(meta.s.digits) {
            10: line_bad_number;
            default: line_byte;
        }
    }

    state line_bad_number {
        meta.bad_number = 1;
        transition accept;
    }

    state line_cr {
        meta.s.head_at = meta.s.head_at + 1;
        meta.s.line_len = meta.s.line_len + 1;
        meta.s.remaining = meta.s.remaining - 1;
        meta.s.head_then = HEAD_THEN_CR;
        transition head_end;
    }

    state line_cr_found {
        meta.line_found = 1;
        transition select(meta.s.remaining) {
            0: accept;  /* no '\n' */
            default: line_lf;
        }
    }

    state line_lf {
        pkt.extract(hdr.lf);
        meta.s.remaining = meta.s.remaining - 1;
        transition accept;
    }
}

control MbDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.packet_in);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.ipv4_options);
        pkt.emit(hdr.ports);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.tcp);
        pkt.emit(hdr.tcp_options);
        pkt.emit(hdr.frame);
        pkt.emit(hdr.command4);
        pkt.emit(hdr.word_rest);
        pkt.emit(hdr.key32);
        pkt.emit(hdr.key_words);
        pkt.emit(hdr.key4);
        pkt.emit(hdr.key2);
        pkt.emit(hdr.key1);
        pkt.emit(hdr.key_end);
        pkt.emit(hdr.head_words);
        pkt.emit(hdr.head_rest);
        pkt.emit(hdr.line32);
        pkt.emit(hdr.line_words);
        pkt.emit(hdr.line_tail);
        pkt.emit(hdr.lf);
    }
}

#endif
