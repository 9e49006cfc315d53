/* Headers and metadata of p4src/mbalancer.p4. Sizes and numbers shared with the control plane are named in
 * dataplanes/p4/pipeline.py too; tests/test_p4runtime_driver.py checks the table and counter sizes against the
 * P4Info, so a change here that it misses fails a test. */
#ifndef MB_HEADERS_P4
#define MB_HEADERS_P4

#define MB_MAX_KEY 250       /* memcached's key limit */
#define MB_KEY_BITS 2000     /* the key as one number: MB_MAX_KEY bytes, right-aligned */
#define MB_LINE_BYTES 256    /* the rest of a command line after its key that is read to prove it whole */
#define MB_KEY_STEPS 7       /* 32-byte steps of a key (224 bytes), */
#define MB_KEY_WORDS 3       /* ... then 8-byte steps (to 248 bytes; its last bytes, fewer than 8, in 3 chunks) */
#define MB_LINE_HEAD 48      /* line bytes read one at a time up to the data length's end (a longer head: unsure) */
#define MB_HEAD_WORDS 6      /* ... taken 8 at a time (47 after the key's end), the last ones in chunks */
#define MB_LINE_STEPS 7      /* 32-byte steps of the line after that (nothing in them but where '\r' is not), */
#define MB_LINE_WORDS 3      /* ... then 8-byte steps (its last bytes, fewer than 8, in 3 chunks, then '\r') */
#define MB_MAX_HOT 4096      /* hot keys (slots) */
#define MB_MAX_REPLICAS 8    /* servers one hot key can be spread over */
#define MB_MAX_SERVERS 256
#define MB_FLOW_BITS 16      /* reply_source remembers 2^16 balanced gets (a newer one takes an older one's place) */
#define MB_LEARN_BITS 12     /* forward learns 2^12 source MACs (likewise) */
#define MB_CLOSING_BITS 12   /* the controller's connections closing at once (likewise) */
#define MB_STREAM_BITS 14    /* TCP connections read as streams at once (likewise) */
#define MB_COPY_FIELDS 1     /* the metadata a copy to the controller keeps (field list) */
#define MB_SKETCH_ROWS 4     /* count-min sketch of get keys: rows (the eBPF program's: the same error bound) */
#define MB_SKETCH_BITS 14    /* ... 2^14 cells per row */
#define MB_SKETCH_DIGEST 1   /* the digest that reports a heavy key (v1model's receiver argument) */
#define TCP_FIN 0x01
#define TCP_RST 0x04
#define MB_CPU_PORT 255      /* simple_switch_grpc --cpu-port: PacketIn / PacketOut */
#define MB_MIRROR_SESSION 100  /* clone session to the CPU port, written by the controller */
#define MB_FLOOD_GROUP 1     /* multicast group of every switch port, written by the controller */
#define MB_NO_DATA 0xff      /* the command has no data block */

/* Commands (mb_command in dataplanes/bpf/src/parse.h: the same classes) */
#define CMD_NONE 0   /* nothing read yet (empty payload) */
#define CMD_OTHER 1  /* not a command the pipeline reads: unsure */
#define CMD_GET 2    /* get, gets */
#define CMD_WRITE 3  /* a write the controller must see */
#define CMD_READ 4   /* mg: reads, unless its flags ask for a change (T, N, I) */
#define CMD_NOOP 5   /* mn */
#define CMD_LINE 6   /* stats, version: a line without a key that changes no item */

/* meta.rewrite: what `servers` looks meta.server_wanted up for (p4src/mbalancer.p4, MbRewrite) */
#define REWRITE_NONE 0
#define REWRITE_GET 1       /* a balanced get: its destination */
#define REWRITE_REPLY 2     /* a reply to a balanced get: its source (the home's) */
#define REWRITE_UPSTREAM 3  /* a get another switch balanced: its flow remembered for its reply */

/* Switch-wide counters: the index of each in `switch_counters` (the eBPF program's enum mb_counter, same order). */
#define C_PACKETS 0
#define C_MEMCACHED 1
#define C_UNPARSED 2
#define C_BALANCED 3
#define C_ALREADY_BALANCED 4
#define C_MIRRORED 5
#define C_REPLIES_REWRITTEN 6
#define C_FLOODED 7
#define C_DROPPED 8
#define C_UNSURE 9
#define C_CLONED 10
#define C_LEASE_EXPIRED 11
#define C_COALESCED 12  /* never counted here: every unsure request is copied */
#define C_COUNT 13

const bit<16> IP_BALANCED = 0x8000;  /* IPv4 reserved flag bit: "already balanced by a switch on the path" */
/* flow_homes: the get was balanced by a switch before this one, so its reply gets the home's IP and port here but
 * keeps the replica's MAC (the switches after this one learn no MAC at a port it is not behind) */
const bit<32> FLOW_UPSTREAM = 0x80000000;

/* To the controller: a copy of a write (or of a request it must check) and the port it came in on. */
@controller_header("packet_in")
header packet_in_t {
    bit<16> ingress_port;
    bit<32> stream_start;  /* with stream 1: the sequence number where its connection's unread stretch began */
    bit<8> stream;         /* 1: a segment of a connection read as a stream (the controller follows it) */
    bit<8> report;         /* no packet, an answer (REPORT_*): 1 to a rearm (op 2), 2 to a lease query (op 3) */
    bit<48> quiet_us;      /* report 1: microseconds since the server's latest coalescable unsure request;
                            * report 2: microseconds left on the controller's lease (0: over, or never given) */
}

/* From the controller: renew its lease (the pipeline sets the lease's end to its own clock + lease_us, so no clock
 * is shared between switch and controller), rearm a server's unsure report, answered by a PacketIn saying how
 * long ago its latest coalescable unsure request passed, or ask how long the lease has left, answered by a PacketIn
 * too (registers cannot be read over P4Runtime). Anything else from the CPU port is dropped. */
@controller_header("packet_out")
header packet_out_t {
    bit<8> op;         /* OP_*: 1 renews the lease; 2 rearms a server's unsure report and answers how quiet it is;
                        * 3 answers how many microseconds the lease has left */
    bit<32> lease_us;  /* op 1: from now; 0 ends it */
    bit<32> server;    /* op 2 */
}
/* packet_out.op (dataplanes/p4/tables.py: OP_LEASE, OP_REARM, OP_LEASE_QUERY) */
const bit<8> OP_LEASE = 1;        /* lease_until = now + lease_us; counted in lease_renewals */
const bit<8> OP_REARM = 2;        /* unsure_reported[server] = 0; answered: REPORT_QUIET */
const bit<8> OP_LEASE_QUERY = 3;  /* answered: REPORT_LEASE_LEFT */
/* packet_in.report: what an answer carries in quiet_us */
const bit<8> REPORT_NONE = 0;        /* a packet (a copy), not an answer */
const bit<8> REPORT_QUIET = 1;       /* microseconds since the server's latest coalescable unsure request */
const bit<8> REPORT_LEASE_LEFT = 2;  /* microseconds left on the lease: lease_until - now, 0 once it is over */

header ethernet_t {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4> version;
    bit<4> ihl;
    bit<8> diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<16> flags_frag;  /* flags and fragment offset as one word: the balanced mark and checksums use it whole */
    bit<8> ttl;
    bit<8> protocol;
    bit<16> checksum;
    bit<32> src;
    bit<32> dst;
}

header ipv4_options_t {
    varbit<320> options;
}

header ports_t {  /* the first 4 bytes of UDP and TCP */
    bit<16> src;
    bit<16> dst;
}

header udp_rest_t {
    bit<16> length;
    bit<16> checksum;
}

header tcp_rest_t {
    bit<32> seq;
    bit<32> ack;
    bit<4> data_offset;
    bit<4> reserved;
    bit<8> flags;
    bit<16> window;
    bit<16> checksum;
    bit<16> urgent;
}

header tcp_options_t {
    varbit<320> options;
}

/* memcached's UDP frame header */
header frame_t {
    bit<16> request_id;
    bit<16> sequence;
    bit<16> datagrams;
    bit<16> reserved;
}

/* The command line as v1model parsers take it: whole headers, into header stacks the deparser re-emits unchanged.
 * Where a step may take 8 bytes it does (a word), else a byte: every header instance costs bmv2 per packet, in use
 * or not (measured: 520 one-byte instances halved the packets/s). */
header byte_t {
    bit<8> b;
}

header word_t {
    bit<64> w;
}

/* A stretch of 32-byte windows (at most 7: MB_KEY_STEPS, MB_LINE_STEPS) looked at one more each step and taken in one
 * extract where it ends: one header instance where a stack of them was one per window (bmv2 resets every instance
 * per packet, used or not). */
header wide_t {
    varbit<1792> v;
}

/* The last bytes of a part (fewer than 8, found before they are taken), where their value is read from elsewhere or
 * not at all, and the byte that ended it: in one extract of the length found (one header instance for any length). */
header rest_t {
    varbit<64> v;
}

/* The key's last bytes (their value is added to the key) as at most three chunks. */
header chunk4_t {
    bit<32> v;
}

header chunk2_t {
    bit<16> v;
}

header chunk1_t {
    bit<8> v;
}

header command4_t {
    bit<32> c;  /* "get " or "set ": the command word and its space in one step */
}

struct headers_t {
    packet_out_t packet_out;
    packet_in_t packet_in;
    ethernet_t ethernet;
    ipv4_t ipv4;
    ipv4_options_t ipv4_options;
    ports_t ports;
    udp_rest_t udp;
    tcp_rest_t tcp;
    tcp_options_t tcp_options;
    frame_t frame;
    command4_t command4;            /* "get " or "set ", read at once; else: */
    rest_t word_rest;               /* the command word (up to 7 bytes) and the byte that ended it: ' ' or '\r' */
    wide_t key32;                   /* the key: 32 bytes at a time, */
    word_t[MB_KEY_WORDS] key_words; /* ... then 8, */
    chunk4_t key4;                  /* ... then its last bytes */
    chunk2_t key2;
    chunk1_t key1;
    byte_t key_end;                 /* the byte that ended the key (' ' or '\r'), */
    word_t[MB_HEAD_WORDS] head_words;  /* the line after it to the data length's end (or '\r'): 8 at a time, */
    rest_t head_rest;               /* ... then its last bytes */
    wide_t line32;                  /* then 32 bytes at a time, */
    word_t[MB_LINE_WORDS] line_words;  /* ... then 8, */
    rest_t line_tail;               /* ... then the last bytes and the '\r' */
    byte_t lf;                      /* the '\n' after it */
}

/* A get's key whose sketch estimate reached the reader's threshold (its latest estimate: the reader keeps the
 * largest per key and epoch). */
struct sketch_report_t {
    bit<16> epoch;
    bit<32> estimate;
    bit<32> ip;            /* where the get was sent */
    bit<16> port;
    bit<8> key_len;
    bit<MB_KEY_BITS> key;
}

/* Per-packet values the program always writes before it reads them. A header, not metadata: bmv2 zeroes every
 * metadata field of every packet (~650 instructions each), a header only has its validity bit reset. Never made valid
 * (setValid zeroes every field of a header that is not valid) nor emitted: bmv2 reads and writes the fields of a
 * header that is not valid as any other, but a table key on one reads as zeros (the keys are metadata_t's) and a
 * hash skips it (meta.c, meta.fk, meta.k are made valid). */
header scratch_t {
    /* the ingress jobs' working values (p4src/mbalancer.p4) */
    bit<48> last;
    bit<48> until;
    bit<32> h;
    bit<32> stream_slot;
    bit<64> stream_id;
    bit<64> stored;
    bit<32> first;
    bit<16> second;
    bit<32> step;          /* (also the parser's: a 32-byte stretch's windows looked at before the next one) */
    bit<32> mask;
    bit<32> estimate;
    bit<48> cell;
    bit<64> n64;
    bit<64> written;
    bit<64> unsure_count;
    bit<64> closed;
    bit<1> keep_mac;       /* reply_source: the reply keeps the replica's MAC (the get was balanced upstream) */
    bit<1> reported;       /* MAKE_UNSURE_COALESCED: unsure_reported's bit */
    bit<6> pad;            /* (bmv2: a header is whole bytes) */
    bit<48> mac;
    bit<64> look;          /* parser: the next 8 bytes (fewer where the payload ends: zeros after them) */
    bit<8> look1;          /* parser: the next N bytes where fewer than 8 are left */
    bit<16> look2;
    bit<24> look3;
    bit<32> look4;
    bit<40> look5;
    bit<48> look6;
    bit<56> look7;
    bit<32> cell_at;       /* sketch_cell: the cell */
    bit<256> look32;       /* parser: the next 32 bytes (in a 32-byte stretch: the last 32 of windowsN) */
    bit<512> windows2;     /* parser: a 32-byte stretch's windows looked at, not taken yet, and the next one: 2 */
    bit<768> windows3;     /* ... 3 (a field each: a lookahead into a slice of one field is not bmv2's, and one */
    bit<1024> windows4;    /* into a field of another width is a compiler temporary, as costly: metadata bmv2 */
    bit<1280> windows5;    /* zeroes per packet; shared by the key's and the line's stretches) */
    bit<1536> windows6;
    bit<1792> windows7;
    bit<8> head_at;        /* parser: bytes of the look read in the line's head (not taken yet) */
    bit<8> head_byte;      /* parser: the head's byte being read */
    bit<8> head_then;      /* parser: where the head's end goes on to (HEAD_THEN_*) */
    bit<16> line_len;      /* bytes of the line read */
    bit<16> line_left;     /* bytes the line may still have within MB_LINE_BYTES (its last bytes) */
    bit<16> ip_end;        /* bytes from the frame's start to the end of the IPv4 packet */
    bit<16> payload_len;   /* after the UDP (and frame) or TCP header */
    bit<16> command_len;   /* bytes of the command: the payload after the frame header (UDP), the payload (TCP) */
    bit<16> remaining;     /* payload bytes not yet read (after "get " or "set ": and those 4, until the key ends) */
    bit<8> data_field;     /* which field after the key is the data length (MB_NO_DATA: none) */
    bit<32> dest_server;
    bit<32> home;
    bit<64> synced_writes;
    bit<64> synced_unsure;
    bit<32> replica;
    bit<32> replica_position;
    bit<48> server_mac;
    bit<32> server_ip;
    bit<16> server_port;
    bit<48> quiet_us;
    bit<8> report;         /* REPORT_*: an answer to the controller (op 2, op 3), in place of the packet */
    bit<32> closing_server;  /* the server whose memcached sent this FIN or RST */
    bit<64> handled;         /* closes_handled: the closes of it the controller has dealt with */
    bit<16> sketch_epoch;
    bit<32> report_from;
    bit<32> report_mask;     /* sketch_report_step: an estimate is reported where these bits are 0 */
    bit<32> parity;          /* the sketch's epoch parity: which half of its counters */
    bit<16> csum;            /* rewrite: a one's complement sum so far (CSUM) */
    bit<32> index;           /* a register's value or a counter's index, computed before the extern is called
                              * (ternaries in it as `if`s: p4c makes a temporary of a ternary) */
    /* the parser's own (p4src/parser.p4) */
    bit<32> span;            /* ip_end less the transport header's end (its sign: the packet ends inside it) */
    bit<64> word;            /* the command word as a number */
    bit<8> in_field;         /* 1: the line's head is in a field (set where the head starts) */
    bit<8> digits;           /* digits of the data length read (likewise) */
}

/* The words a checksum update sums (p4src/mbalancer.p4, MbRewrite), given to bmv2's csum16 as a header whole: a list
 * of fields would be copied into compiler temporaries, metadata bmv2 zeroes for every packet. The checksum (or the
 * sum so far), an address, two more words (0 where there are none: a 0 adds nothing to a one's complement sum). */
header sum_t {
    bit<16> sum;
    bit<32> ip;
    bit<16> w1;
    bit<16> w2;
}

/* A balanced get's flow, whose CRC is its slot in flow_ids: a header for the same reason. */
header flow_key_t {
    bit<32> ip;          /* the client's */
    bit<16> port;
    bit<16> request_id;
}

/* The key and its length, zeroed by the parser where a command's key starts (KEY_START): as metadata, bmv2 would
 * zero its 2,000 bits for every packet, and copy it for the sketch's hashes, which take this header whole. */
header key_t {
    bit<8> len;             /* 0: no valid key */
    bit<MB_KEY_BITS> key;   /* the key as a number (its bytes, big-endian): hot_keys matches it with its length */
}

struct metadata_t {
    /* parser */
    bit<1> l4;             /* an unfragmented IPv4 UDP or TCP packet whose lengths add up */
    bit<1> first_fragment; /* the first fragment of one: ports read, nothing after them */
    bit<1> frame_ok;       /* UDP: a single-datagram frame header was read */
    bit<8> command;        /* CMD_* */
    key_t k;               /* the key (a header: bmv2 zeroes its 2,000 bits only where a command has a key) */
    bit<1> line_found;     /* '\r' found within MB_LINE_BYTES */
    bit<8> fields;         /* fields of the line started */
    bit<64> number;        /* the data length */
    bit<1> bad_number;
    bit<1> changes;        /* a flag that makes a meta command change the item (T, N, I) */
    /* ingress: what each job decided, for the jobs after it (p4src/mbalancer.p4, MbIngress) */
    bit<1> reply;          /* classify: a UDP datagram from a memcached port (reply_source may rewrite it) */
    bit<1> server_closed;  /* classify: a FIN or RST from the memcached of a server of the config, to the controller */
    bit<1> unsure_it;      /* read_request: a request not exactly one command the pipeline reads */
    bit<1> whole;          /* read_request: the payload is exactly one whole command */
    bit<7> rewrite;        /* REWRITE_*: which rewrite of meta.server_wanted's address (hot_get, reply_source,
                            * read_request). 7 bits for 2: the metadata then fills whole bytes, and p4c adds no
                            * padding field, which bmv2 would zero for every packet as any other */
    bit<1> request;        /* to a memcached port */
    bit<1> dest_known;     /* the destination is a server of the config */
    bit<1> trusted;        /* from the controller: its copies never make a server unsure */
    bit<1> clone_it;
    @field_list(MB_COPY_FIELDS)
    bit<32> stream_start;    /* the tracked connection's: where its unread stretch began */
    @field_list(MB_COPY_FIELDS)
    bit<8> stream;           /* 1: the segment belongs to a connection read as a stream */
    bit<1> mid_stream;       /* a later segment of such a connection: unsure, whatever it looks like */
    bit<1> coalesce;         /* unsure, and unreadable by the controller too: one copy per report is enough */
    bit<1> hairpin;          /* a get this switch balanced: it may leave by the port it came in by, flooded too */
    /* table keys: a key on a field of a header that is not valid (meta.s) is read as zeros by bmv2 */
    bit<32> slot;
    bit<16> point;         /* the request's hash: which replica's range it falls in */
    bit<32> server_wanted;
    bit<32> sketch_estimate;
    scratch_t s;           /* written before read: not zeroed per packet (never made valid: setValid would zero it) */
    sum_t c;               /* written before read: made valid where used (not zeroed again while valid) */
    flow_key_t fk;         /* likewise */
}

#endif
