/* Parsing: Ethernet / IPv4 / UDP or TCP / memcached UDP frame header / ASCII command, key and the rest of its line.
 * The same reading as dataplanes/ebpf/bpf/parse.h, with v1model's mechanism:
 * - The eBPF program loads the key and scans it a word at a time; a P4 parser can only iterate by going from
 *   state to state, so the command word, the key and the line are read one byte per state (a lookahead decides
 *   before each byte is taken). The key is accumulated into one 2000-bit number for hot_keys' exact match.
 * - `remaining` (payload bytes not read yet, from the IPv4 total length) guards every lookahead, so a short or
 *   unpadded frame is never read past its end and Ethernet padding is never read as payload.
 * - A parser cannot branch on a comparison directly: the length checks are done in the ingress control from
 *   what the parser recorded (ip_end, payload_len, line state). */
#ifndef MB_PARSER_P4
#define MB_PARSER_P4

parser MbParser(packet_in pkt, out headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    state start {
        meta.data_field = MB_NO_DATA;
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
        meta.ip_end = 14 + hdr.ipv4.total_len;
        transition select(hdr.ipv4.version, hdr.ipv4.ihl) {
            (4, 5): parse_ipv4_protocol;
            (4, 0 &&& 0xc): accept;   /* ihl 0..3: broken */
            (4, 4): accept;
            (4, _): parse_ipv4_options;
            default: accept;
        }
    }

    state parse_ipv4_options {
        pkt.extract(hdr.ipv4_options, (bit<32>)(((bit<16>)hdr.ipv4.ihl - 5) * 32));
        transition parse_ipv4_protocol;
    }

    state parse_ipv4_protocol {
        /* a later fragment has no transport header; a first one (more fragments) only its ports */
        transition select(hdr.ipv4.flags_frag & 0x3fff, hdr.ipv4.protocol) {
            (0, 17): parse_udp;
            (0, 6): parse_tcp;
            (0x2000, 17): parse_first_fragment;
            (0x2000, 6): parse_first_fragment;
            default: accept;
        }
    }

    state parse_first_fragment {
        pkt.extract(hdr.ports);
        meta.first_fragment = 1;
        transition accept;
    }

    state parse_udp {
        pkt.extract(hdr.ports);
        pkt.extract(hdr.udp);
        meta.payload_len = meta.ip_end - 14 - ((bit<16>)hdr.ipv4.ihl << 2) - 8;
        transition select(meta.ip_end < 14 + ((bit<16>)hdr.ipv4.ihl << 2) + 8) {
            true: accept;  /* the IPv4 packet ends inside the UDP header */
            false: parse_udp_payload;
        }
    }

    state parse_udp_payload {
        meta.l4 = 1;
        meta.remaining = meta.payload_len;
        transition select(meta.payload_len < 8) {
            true: accept;
            false: parse_frame;
        }
    }

    state parse_frame {
        pkt.extract(hdr.frame);
        meta.remaining = meta.remaining - 8;
        meta.command_len = meta.remaining;
        transition select(hdr.frame.sequence, hdr.frame.datagrams) {
            (0, 1): frame_ok;  /* sequence 0 of 1 datagram */
            default: accept;
        }
    }

    state frame_ok {
        meta.frame_ok = 1;
        transition parse_command;
    }

    state parse_tcp {
        pkt.extract(hdr.ports);
        pkt.extract(hdr.tcp);
        transition select(hdr.tcp.data_offset) {
            0 &&& 0xc: accept;  /* 0..3: broken */
            4: accept;
            5: parse_tcp_payload;
            default: parse_tcp_options;
        }
    }

    state parse_tcp_options {
        pkt.extract(hdr.tcp_options, (bit<32>)(((bit<16>)hdr.tcp.data_offset - 5) * 32));
        transition parse_tcp_payload;
    }

    state parse_tcp_payload {
        bit<16> headers = 14 + ((bit<16>)hdr.ipv4.ihl << 2) + ((bit<16>)hdr.tcp.data_offset << 2);
        meta.payload_len = meta.ip_end - headers;
        meta.remaining = meta.payload_len;
        meta.command_len = meta.payload_len;
        transition select(meta.ip_end < headers) {
            true: accept;
            false: tcp_ok;
        }
    }

    state tcp_ok {
        meta.l4 = 1;
        transition parse_command;
    }

    /* The command word: up to 7 bytes, ended by ' ' or '\r'. */
    state parse_command {
        transition select(meta.remaining) {
            0: accept;  /* nothing to read: a bare TCP ACK, an empty datagram */
            default: word_byte;
        }
    }

    state word_byte {
        transition select(meta.remaining, pkt.lookahead<bit<8>>(), meta.word_len) {
            (0, _, _): command_other;       /* no end */
            (_, 0x20, _): word_space;
            (_, 0x0d, _): word_cr;
            (_, _, 7): command_other;       /* too long for any command */
            default: word_take;
        }
    }

    state word_take {
        pkt.extract(hdr.word.next);
        meta.word = (meta.word << 8) | (bit<64>)hdr.word.last.b;
        meta.word_len = meta.word_len + 1;
        meta.remaining = meta.remaining - 1;
        transition word_byte;
    }

    state command_other {
        meta.command = CMD_OTHER;
        transition accept;
    }

    state word_space {
        pkt.extract(hdr.word_end);
        meta.remaining = meta.remaining - 1;
        transition select(meta.word) {
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
        pkt.extract(hdr.word_end);
        meta.remaining = meta.remaining - 1;
        transition select(meta.word) {
            0x7374617473: line_after_cr;          /* stats */
            0x76657273696f6e: line_after_cr;      /* version */
            0x6d6e: noop;                         /* mn */
            default: command_other;
        }
    }

    state get { meta.command = CMD_GET; transition key_byte; }
    state meta_get { meta.command = CMD_READ; transition key_byte; }
    state write_data_2 { meta.command = CMD_WRITE; meta.data_field = 2; transition key_byte; }
    state write_data_0 { meta.command = CMD_WRITE; meta.data_field = 0; transition key_byte; }
    state write_no_data { meta.command = CMD_WRITE; transition key_byte; }
    state line_after_space { meta.command = CMD_LINE; meta.line_len = 1; transition line_byte; }
    state line_after_cr { meta.command = CMD_LINE; transition line_cr_found; }
    state noop { meta.command = CMD_NOOP; transition line_cr_found; }

    /* The key as memcached's text protocol reads it: 1..250 bytes, any but space, '\r', '\n' and NUL (control
     * characters included), ended by ' ' or '\r'; anything else: no key (key_len 0). */
    state key_byte {
        transition select(meta.remaining, pkt.lookahead<bit<8>>(), meta.key_len) {
            (0, _, _): no_key;
            (_, 0x20, 0): no_key;
            (_, 0x0d, 0): no_key;
            (_, 0x20, _): key_end_space;
            (_, 0x0d, _): key_end_cr;
            (_, 0x0a, _): no_key;         /* a line end with no '\r' */
            (_, 0x00, _): no_key;         /* memcached refuses it */
            (_, _, MB_MAX_KEY): no_key;   /* a 251st byte */
            default: key_take;
        }
    }

    state key_take {
        pkt.extract(hdr.key.next);
        meta.key = (meta.key << 8) | (bit<MB_KEY_BITS>)hdr.key.last.b;
        meta.key_len = meta.key_len + 1;
        meta.remaining = meta.remaining - 1;
        transition key_byte;
    }

    state no_key {
        meta.key_len = 0;
        transition accept;
    }

    state key_end_space {
        pkt.extract(hdr.line.next);
        meta.line_len = 1;
        meta.remaining = meta.remaining - 1;
        transition line_byte;
    }

    state key_end_cr {
        pkt.extract(hdr.line.next);
        meta.line_len = 1;
        meta.remaining = meta.remaining - 1;
        transition line_cr_found;
    }

    /* The rest of the line (the byte that ended the key counts as its first): fields, the data length, the flags
     * that make a meta command change the item, and where '\r' is. */
    state line_byte {
        transition select(meta.remaining, pkt.lookahead<bit<8>>(), meta.line_len) {
            (0, _, _): accept;                   /* no '\r' */
            (_, _, MB_LINE_BYTES): accept;       /* none within reach */
            (_, 0x0d, _): line_cr;
            (_, 0x20, _): line_space;
            default: line_char;
        }
    }

    state line_space {
        pkt.extract(hdr.line.next);
        meta.line_len = meta.line_len + 1;
        meta.remaining = meta.remaining - 1;
        meta.in_field = 0;
        transition line_byte;
    }

    state line_char {
        pkt.extract(hdr.line.next);
        meta.line_len = meta.line_len + 1;
        meta.remaining = meta.remaining - 1;
        transition select(meta.in_field) {
            0: line_field_starts;
            default: line_flags;
        }
    }

    state line_field_starts {
        meta.in_field = 1;
        meta.fields = meta.fields + 1;
        transition line_flags;
    }

    state line_flags {
        transition select(hdr.line.last.b) {
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
        transition select(meta.fields - meta.data_field, hdr.line.last.b) {
            (1, 0x30 &&& 0xf8): line_digit;  /* 0..7 */
            (1, 0x38 &&& 0xfe): line_digit;  /* 8, 9 */
            (1, _): line_bad_number;
            default: line_byte;
        }
    }

    state line_digit {
        meta.number = meta.number * 10 + (bit<64>)(hdr.line.last.b - 0x30);
        meta.digits = meta.digits + 1;
        transition select(meta.digits) {
            10: line_bad_number;
            default: line_byte;
        }
    }

    state line_bad_number {
        meta.bad_number = 1;
        transition accept;
    }

    state line_cr {
        pkt.extract(hdr.line.next);
        meta.line_len = meta.line_len + 1;
        meta.remaining = meta.remaining - 1;
        transition line_cr_found;
    }

    state line_cr_found {
        meta.line_found = 1;
        transition select(meta.remaining) {
            0: accept;  /* no '\n' */
            default: line_lf;
        }
    }

    state line_lf {
        pkt.extract(hdr.lf);
        meta.remaining = meta.remaining - 1;
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
        pkt.emit(hdr.word);
        pkt.emit(hdr.word_end);
        pkt.emit(hdr.key);
        pkt.emit(hdr.line);
        pkt.emit(hdr.lf);
    }
}

#endif
