/* MBalancer's data plane in P4_16 for v1model (bmv2 simple_switch_grpc), table for table the pipeline of the
 * eBPF switch (dataplanes/bpf/src/mbalancer.bpf.c; docs/architecture.md, "The pipeline"):
 *   hot_keys + synced + replicas + servers   hot_get: a single-key UDP get/gets of a hot key goes home untouched
 *                if the key is dirty or the controller's lease ran out; else to a replica chosen by weight from a
 *                hash of the request id and client (the eBPF program's hash: the same packet picks the same
 *                replica), dst MAC/IP/port rewritten with checksums fixed, marked balanced
 *   hot_keys + server_index   set_mirror: a write (UDP or TCP) to a hot key's home is counted in its slot (dirty)
 *                and cloned to the controller (a PacketIn); a request to a server that is not exactly one command
 *                the pipeline reads makes that server unsure (all its hot keys dirty) and is cloned too
 *   flows (registers)   reply_source: every datagram of the reply to a balanced get leaves with the home's source
 *   forward + learned MACs (registers)   L2: set by the controller, else learned from source MACs, else flooded
 *   closes + closes_handled + closing   a server that closed a connection of the controller's (it may have
 *                restarted empty) gets no balanced get, and its hot keys are dirty, until the controller has checked
 *                it; the server's FIN that answers the controller's own close does not count
 *   unsure_reported + unsure_last + blind_streams   what nobody can read (a connection the controller gave up on,
 *                a datagram the pipeline cannot parse) is copied once per report, which the controller rearms with
 *                a PacketOut (answered with how long ago the latest passed)
 *   streams (registers) + stream_resumes   after a TCP segment that was not exactly one whole command, every later
 *                segment of its connection is unsure and copied (with where its unread stretch began), until one
 *                starts where the controller proved a command starts (a `stream_resumes` entry); FIN/RST forget it
 *   sketch (registers) + sketch_control   hot-key detection: while a reader turns it on, every get's key is counted
 *                in a count-min sketch, and a get whose estimate reaches the reader's threshold sends a digest
 *   counters     per hot key and replica, per server (unsure, closes), switch-wide
 * Anything it cannot read is forwarded untouched.
 *
 * The ingress is one control per job, each reading what the ones before it decided from metadata. MbIngress (bottom
 * of this file) applies MbControllerOps to a PacketOut (the lease, rearms, lease queries), else MbLearn, MbClassify
 * (which ports, servers, sources), then down one branch per kind of packet: to a request MbReadRequest (the command,
 * its key hot or not, streams), which applies the jobs of what it read (MbHotGet to a hot get, MbSetMirror to a
 * write to a hot key's home, MbSketch to a get), then MbUnsureRequest if it made the server unsure; to a reply
 * MbReplySource; to a server's close MbServerClosed. Then the `servers` lookup and MbRewrite (destination of a
 * balanced get, source of its reply, with the flows that need) where a job chose a server (meta.rewrite), and
 * MbForward. (Branches, not a flag per job checked for every packet: every condition and every metadata field costs
 * bmv2 per packet.) State that more than one job uses is declared once, before them; every table, action, counter
 * and register keeps the name it has always had in the P4Info (MbIngress.<name>, by @name), so the control plane
 * sees the same program.
 *
 * Where v1model differs from eBPF in mechanism (the behaviour is the same; tests/pipeline_fixtures.py holds both to
 * it):
 * - Loops: the parser reads the line state by state (parser.p4); the weighted choice, a loop over cumulative
 *   weights in eBPF, is a range match on the hash (`replicas`).
 * - Registers cannot be read or written over P4Runtime (PI refuses both). Counts the data plane compares are
 *   registers (writes per slot, unsure per server) with a twin counter the controller reads; what the controller
 *   writes (the synced counts) is a table entry (`synced`); the lease is renewed by a PacketOut, which stores
 *   the switch's own clock + lease_us, and read by another, answered with a PacketIn of the microseconds left.
 * - Checksums are updated incrementally (RFC 1624) as in eBPF, summed by bmv2's csum16 hash (CSUM): v1model's
 *   update_checksum_with_payload would have to list every header of the parsed command line.
 * - Learned MACs and balanced gets live in registers indexed by a hash of them (bmv2's CRC-32 of a balanced get's
 *   flow; a fold of the MAC's bits, LEARN_SLOT): a newer entry takes an older one's place where eBPF's LRU maps
 *   evict the least recently used.
 * - The hot-key sketch (the eBPF program's sketch.h: every get's key counted in a count-min sketch while a reader
 *   turns it on) cannot be zeroed by the reader: each cell carries the epoch it counts for and starts again in a
 *   new one. Its heavy keys are not kept in the switch: a get whose estimate reaches the reader's threshold sends
 *   a digest (key, estimate, destination) to the P4Runtime primary, which keeps the largest per key. */
#include <core.p4>
#include <v1model.p4>

#include "headers.p4"
#include "parser.p4"

control MbVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

/* The switch's state that more than one of the ingress's jobs reads or writes, declared once for all of them. Each
 * keeps the name it had inside MbIngress (@name): the P4Info's names and ids do not depend on where it is
 * declared, so the driver (dataplanes/p4/) and the golden WriteRequest (tests/golden/) stay as they are. */
/* written by the data plane only */
@name(".MbIngress.writes") register<bit<64>>(MB_MAX_HOT) writes;       /* per slot: writes mirrored */
@name(".MbIngress.unsure") register<bit<64>>(MB_MAX_SERVERS) unsure;   /* per server: requests it may hold unread
                                                                         * writes in */
@name(".MbIngress.lease_until")
register<bit<48>>(1) lease_until;                /* ingress_global_timestamp (us) until which gets are balanced */
@name(".MbIngress.flow_ids")
register<bit<64>>(1 << MB_FLOW_BITS) flow_ids;   /* reply_source: client IP, port, request id of a balanced get */
@name(".MbIngress.flow_homes") register<bit<32>>(1 << MB_FLOW_BITS) flow_homes;
@name(".MbIngress.learned_macs") register<bit<48>>(1 << MB_LEARN_BITS) learned_macs;
@name(".MbIngress.learned_ports") register<bit<9>>(1 << MB_LEARN_BITS) learned_ports;
@name(".MbIngress.closes")
register<bit<64>>(MB_MAX_SERVERS) closes;        /* per server: its memcached closed one of the controller's */
@name(".MbIngress.closing")
register<bit<64>>(1 << MB_CLOSING_BITS) closing; /* the controller's connections it closed first (their id) */
@name(".MbIngress.stream_ids")
register<bit<64>>(1 << MB_STREAM_BITS) stream_ids;     /* connections read as streams (their id) */
@name(".MbIngress.stream_starts")
register<bit<32>>(1 << MB_STREAM_BITS) stream_starts;  /* ... and where their unread stretch began */
@name(".MbIngress.unsure_reported")
register<bit<1>>(MB_MAX_SERVERS) unsure_reported;  /* a coalescable unsure request copied since the last rearm */
@name(".MbIngress.unsure_last")
register<bit<48>>(MB_MAX_SERVERS) unsure_last;     /* when the latest coalescable one passed (us) */
/* read by the controller (P4Runtime counters) */
@name(".MbIngress.switch_counters") counter(C_COUNT, CounterType.packets) switch_counters;
@name(".MbIngress.server_unsure")
counter(MB_MAX_SERVERS, CounterType.packets) server_unsure;  /* the twin of `unsure` */

const bit<32> NO_POSITION = 0xffffffff;  /* replica_position: no replicas entry (the home itself) */

@name(".MbIngress.count") action count(bit<32> which) {
    switch_counters.count(which);
}

/* A 32-bit mix of the request id, client port and address: mb_pick in the eBPF program, the same bits. */
@name(".MbIngress.mix") action mix(out bit<32> h, in bit<32> x) {
    h = x * 0x9E3779B1;
    h = h ^ (h >> 15);
    h = h * 0x85EBCA77;
    h = h ^ (h >> 13);
}

/* A balanced get's flow: its slot in flow_ids, bmv2's CRC over the header meta.fk whole (a list would be copied into
 * compiler temporaries, metadata bmv2 zeroes for every packet). A macro: an action or function given `meta` would
 * copy the struct in and out. */
#define FLOW_SLOT(IP, PORT, REQUEST_ID) \
    meta.fk.setValid(); meta.fk.ip = IP; meta.fk.port = PORT; meta.fk.request_id = REQUEST_ID; \
    hash(meta.s.h, HashAlgorithm.crc32, 32w0, meta.fk, 32w1 << MB_FLOW_BITS);

/* OUT = ~(meta.c.sum + ip + w1 + w2), the one's complement sum by bmv2's own csum16 over the header meta.c (as
 * expressions, ~100 big-number operations). Twice is RFC 1624's update: the old words with the checksum in meta.c
 * give ~(HC + m) = ~HC + ~m (in meta.s.csum: an output into meta.c itself makes p4c copy meta.c into a temporary
 * header), put in meta.c.sum; with the new words in their place, ~(that + m') = HC'. Each word set once where it
 * changes: every field write costs bmv2 per packet. */
#define CSUM(OUT) hash(OUT, HashAlgorithm.csum16, 16w0, meta.c, 32w0x10000);

/* A connection of the controller's (its address and port, the server's) to its slot in `closing` (meta.s.h): its
 * close written from the controller's FIN, looked up from the server's answer, so one definition for both. */
#define CLOSING_SLOT(CONTROLLER_IP, CONTROLLER_PORT, SERVER_IP, SERVER_PORT) \
    mix(meta.s.h, CONTROLLER_IP ^ SERVER_IP ^ ((bit<32>)CONTROLLER_PORT << 16 | (bit<32>)SERVER_PORT)); \
    meta.s.h = meta.s.h >> (32 - MB_CLOSING_BITS);

/* Where a connection is kept as a stream (its slot in stream_ids), and its id there. */
@name(".MbIngress.stream_at")
action stream_at(in bit<32> src, in bit<16> src_port, in bit<32> dst, in bit<16> dst_port,
                  out bit<32> slot, out bit<64> id) {
    bit<32> h;
    mix(h, src ^ dst ^ ((bit<32>)src_port << 16 | (bit<32>)dst_port));
    slot = h >> (32 - MB_STREAM_BITS);
    id = src ++ src_port ++ dst_port;
}

/* The request to server SERVER (a meta.s field) may hold writes the pipeline cannot read: every hot key of its
 * server is dirty from now on until the controller has checked them; the controller gets a copy. Requests to no
 * known server are not ours. A macro on meta.s.n64, not an action: an action's parameters are compiler
 * temporaries (metadata bmv2 zeroes for every packet); and n64 is incremented in place after the read, so that p4c
 * passes the field itself to the write (a value it can name as an expression, it copies into a temporary). */
#define MAKE_UNSURE(SERVER) \
    unsure.read(meta.s.n64, SERVER); meta.s.n64 = meta.s.n64 + 1; unsure.write(SERVER, meta.s.n64); \
    server_unsure.count(SERVER); count(C_UNSURE);

/* As MAKE_UNSURE, for a request the controller cannot read either: copied only if no copy of such a request to
 * this server was made since the controller's last rearm (the check that copy starts covers this one). */
#define MAKE_UNSURE_COALESCED(SERVER) \
    MAKE_UNSURE(SERVER) \
    unsure_last.write(SERVER, std.ingress_global_timestamp); \
    unsure_reported.read(meta.s.reported, SERVER); unsure_reported.write(SERVER, 1); \
    meta.clone_it = ~meta.s.reported; \
    if (meta.s.reported == 1) { count(C_COALESCED); }

/* `to = from` as an action: p4c then passes `to` itself to the extern call or table that reads it next. A value it
 * can name as an expression (`x = e; write(x)`) it copies into a compiler temporary instead, a metadata field bmv2
 * zeroes for every packet, on every path (and a table's key goes through one). @hidden: not in the P4Info. */
@hidden action set16(out bit<16> to, in bit<16> from) { to = from; }
@hidden action set32(out bit<32> to, in bit<32> from) { to = from; }
@hidden action set48(out bit<48> to, in bit<48> from) { to = from; }
@hidden action set64(out bit<64> to, in bit<64> from) { to = from; }

/* A PacketOut from the controller (packet_out.op, OP_*): renew the lease, rearm a server's report, tell how long
 * the lease has left. An answer leaves for the CPU port (egress makes it a PacketIn); anything else is dropped. */
control MbControllerOps(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.lease_renewals") counter(1, CounterType.packets) lease_renewals;
    apply {
        if (hdr.packet_out.op == OP_LEASE) {
            set48(meta.s.until, std.ingress_global_timestamp + (bit<48>)hdr.packet_out.lease_us);
            lease_until.write(0, meta.s.until);
            lease_renewals.count(0);  /* the controller waits for it: a lease it ends is over when it returns */
            mark_to_drop(std);  /* no answer */
        } else if (hdr.packet_out.op == OP_REARM && hdr.packet_out.server < MB_MAX_SERVERS) {
            unsure_reported.write(hdr.packet_out.server, 0);
            unsure_last.read(meta.s.last, hdr.packet_out.server);
            if (meta.s.last == 0) {
                meta.s.quiet_us = 48w0xffffffffffff;
            } else {
                meta.s.quiet_us = std.ingress_global_timestamp - meta.s.last;
            }
            meta.s.report = REPORT_QUIET;
            std.egress_spec = MB_CPU_PORT;  /* the answer: a PacketIn */
        } else if (hdr.packet_out.op == OP_LEASE_QUERY) {
            lease_until.read(meta.s.until, 0);
            meta.s.quiet_us = 0;  /* over, or never given: until is 0 */
            if (meta.s.until > std.ingress_global_timestamp) {
                meta.s.quiet_us = meta.s.until - std.ingress_global_timestamp;
            }
            meta.s.report = REPORT_LEASE_LEFT;
            std.egress_spec = MB_CPU_PORT;
        } else {
            mark_to_drop(std);
        }
    }
}

/* A MAC's slot in learned_macs (meta.s.h): the low 12 bits of its vendor's part and of its NIC's, XORed. Not a hash
 * call: bmv2 takes a hash's input as a list, which p4c copies into a compiler temporary (zeroed for every packet). */
#define LEARN_SLOT(MAC) set32(meta.s.h, (bit<32>)(MAC[MB_LEARN_BITS + 23:24] ^ MAC[MB_LEARN_BITS - 1:0]));

/* forward, learning half: before any rewrite (a reply leaving with the home's MAC must not teach the switch that
 * the home sits behind the replica's port); a balanced get keeps its client's MAC but may come back the way it
 * went (a fabric): not learned. */
control MbLearn(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        bit<1> balanced_frame = (bit<1>)(hdr.ipv4.isValid() && (hdr.ipv4.flags_frag & IP_BALANCED) != 0);
        if (hdr.ethernet.isValid() && hdr.ethernet.src[40:40] == 0 && balanced_frame == 0) {
            LEARN_SLOT(hdr.ethernet.src)
            learned_macs.write(meta.s.h, hdr.ethernet.src);
            learned_ports.write(meta.s.h, std.ingress_port);
        }
    }
}

/* Who the packet is between, from the controller's tables: a request to a memcached port (and to which server of
 * the config), from the controller's addresses; or a reply from a memcached port, a server's FIN or RST (and to
 * the controller). */
control MbClassify(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.is_memcached") action is_memcached() { meta.request = 1; }
    @name(".MbIngress.memcached_ports")
    table memcached_ports {  /* the ports memcached servers listen on: a request goes to one */
        key = { hdr.ports.dst: exact; }
        actions = { is_memcached; NoAction; }
        const default_action = NoAction;
        size = 64;
    }

    @name(".MbIngress.reply_ports")
    table reply_ports {  /* the same ports: a reply comes from one */
        key = { hdr.ports.src: exact; }
        actions = { NoAction; }
        const default_action = NoAction;
        size = 64;
    }

    @name(".MbIngress.server_is") action server_is(bit<32> server) { meta.dest_known = 1; meta.s.dest_server = server; }
    @name(".MbIngress.server_index")
    table server_index {  /* which server a request is for */
        key = { hdr.ipv4.dst: exact; hdr.ports.dst: exact; }
        actions = { server_is; NoAction; }
        const default_action = NoAction;
        size = MB_MAX_SERVERS;
    }

    @name(".MbIngress.is_trusted") action is_trusted() { meta.trusted = 1; }
    @name(".MbIngress.trusted_sources")
    table trusted_sources {  /* the controller's addresses: its copies and reads never make a server unsure */
        key = { hdr.ipv4.src: exact; }
        actions = { is_trusted; NoAction; }
        const default_action = NoAction;
        size = 16;
    }

    @name(".MbIngress.closing_server_is") action closing_server_is(bit<32> server) { meta.s.closing_server = server; }
    @name(".MbIngress.closing_servers")
    table closing_servers {  /* which server a reply comes from (server_index, the other way round) */
        key = { hdr.ipv4.src: exact; hdr.ports.src: exact; }
        actions = { closing_server_is; NoAction; }
        const default_action = NoAction;
        size = MB_MAX_SERVERS;
    }

    @name(".MbIngress.is_to_controller") action is_to_controller() { }  /* (its hit is what counts) */
    @name(".MbIngress.controller_addresses")
    table controller_addresses {  /* trusted_sources, as destinations */
        key = { hdr.ipv4.dst: exact; }
        actions = { is_to_controller; NoAction; }
        const default_action = NoAction;
        size = 16;
    }

    /* (nested so that a get passes few conditions: each costs bmv2 per packet) */
    apply {
        /* ports read (UDP, TCP or a first fragment: IPv4 valid), the IPv4 packet wholly in the frame */
        if (hdr.ports.isValid() && meta.s.ip_end <= (bit<16>)std.packet_length) {
            if (memcached_ports.apply().hit) {
                server_index.apply();
                trusted_sources.apply();
            } else if (meta.l4 == 1) {
                if (reply_ports.apply().hit) {
                    if (hdr.udp.isValid()) {
                        meta.reply = 1;
                    } else if ((hdr.tcp.flags & (TCP_FIN | TCP_RST)) != 0) {
                        /* a FIN or RST from a server of the config to the controller */
                        if (closing_servers.apply().hit) {
                            if (controller_addresses.apply().hit) {
                                meta.server_closed = 1;
                            }
                        }
                    }
                }
            }
        }
    }
}

/* Hot-key detection: while a reader turns it on, every get's key is counted in a count-min sketch (the key's cells
 * in every row, the least is its estimate), and a get whose estimate reaches the reader's threshold sends a
 * digest. */
control MbSketch(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.sketch")
    register<bit<48>>(MB_SKETCH_ROWS << MB_SKETCH_BITS) sketch;  /* per cell: its epoch (16 bits), its count (32) */
    /* gets the sketch counted, per epoch parity: one cell per server, then one for any other destination */
    @name(".MbIngress.sketch_destinations")
    counter(2 * (MB_MAX_SERVERS + 1), CounterType.packets) sketch_destinations;
    @name(".MbIngress.sketch_digests")
    counter(2, CounterType.packets) sketch_digests;  /* digests sent, per epoch parity: the reader waits for them */

    @name(".MbIngress.sketch_on") action sketch_on(bit<16> epoch, bit<32> report_from) {
        meta.s.sketch_epoch = epoch;
        meta.s.report_from = report_from;
    }
    @name(".MbIngress.sketch_control")
    table sketch_control {  /* the default action, set by the sketch's reader: NoAction is off */
        key = { }
        actions = { sketch_on; NoAction; }
        default_action = NoAction;
        size = 1;
    }

    /* An estimate of 2^b or more (b >= 9) is reported only at multiples of 2^(b-8): 256 digests per doubling
     * instead of one per get, the last one reported within 1/256 of the estimate (the reader keeps the largest). */
    @name(".MbIngress.report_every") action report_every(bit<32> mask) { meta.s.report_mask = mask; }
    @name(".MbIngress.sketch_report_step")
    table sketch_report_step {
        key = { meta.sketch_estimate: ternary @name("meta.sketch_estimate"); }
        actions = { report_every; }
        const default_action = report_every(0);
        const entries = {
            32w0x00000200 &&& 32w0xfffffe00 : report_every(0x1);
            32w0x00000400 &&& 32w0xfffffc00 : report_every(0x3);
            32w0x00000800 &&& 32w0xfffff800 : report_every(0x7);
            32w0x00001000 &&& 32w0xfffff000 : report_every(0xf);
            32w0x00002000 &&& 32w0xffffe000 : report_every(0x1f);
            32w0x00004000 &&& 32w0xffffc000 : report_every(0x3f);
            32w0x00008000 &&& 32w0xffff8000 : report_every(0x7f);
            32w0x00010000 &&& 32w0xffff0000 : report_every(0xff);
            32w0x00020000 &&& 32w0xfffe0000 : report_every(0x1ff);
            32w0x00040000 &&& 32w0xfffc0000 : report_every(0x3ff);
            32w0x00080000 &&& 32w0xfff80000 : report_every(0x7ff);
            32w0x00100000 &&& 32w0xfff00000 : report_every(0xfff);
            32w0x00200000 &&& 32w0xffe00000 : report_every(0x1fff);
            32w0x00400000 &&& 32w0xffc00000 : report_every(0x3fff);
            32w0x00800000 &&& 32w0xff800000 : report_every(0x7fff);
            32w0x01000000 &&& 32w0xff000000 : report_every(0xffff);
            32w0x02000000 &&& 32w0xfe000000 : report_every(0x1ffff);
            32w0x04000000 &&& 32w0xfc000000 : report_every(0x3ffff);
            32w0x08000000 &&& 32w0xf8000000 : report_every(0x7ffff);
            32w0x10000000 &&& 32w0xf0000000 : report_every(0xfffff);
            32w0x20000000 &&& 32w0xe0000000 : report_every(0x1fffff);
            32w0x40000000 &&& 32w0xc0000000 : report_every(0x3fffff);
            32w0x80000000 &&& 32w0x80000000 : report_every(0x7fffff);
        }
        size = 32;
    }

    /* One of the key's cells: counted in this epoch (a cell last counted in another starts again at 1). */
    /* (meta.s.cell_at: which; meta.s.estimate: the least count so far) */
    @name(".MbIngress.sketch_cell") action sketch_cell() {
        sketch.read(meta.s.cell, meta.s.cell_at);
        /* (the cell changed in place, each way in a branch: p4c passes the field itself to the write, where a value
         * it can name as an expression would go through a compiler temporary, zeroed for every packet) */
        if (meta.s.cell[47:32] == meta.s.sketch_epoch) {
            meta.s.cell = meta.s.cell + 1;
        } else {
            meta.s.cell = meta.s.sketch_epoch ++ 32w1;
        }
        sketch.write(meta.s.cell_at, meta.s.cell);
        if (meta.s.cell[31:0] < meta.s.estimate) {
            meta.s.estimate = meta.s.cell[31:0];
        }
    }

    apply {  /* applied to a get (of a multi-key one, its first key) */
        switch (sketch_control.apply().action_run) {  /* (the action run, not a flag: no metadata field) */
            sketch_on: {
                hash(meta.s.first, HashAlgorithm.crc32, 32w0, meta.k, 64w0x100000000);  /* its length and key */
                hash(meta.s.second, HashAlgorithm.crc16, 16w0, meta.k, 32w0x10000);
                meta.s.step = (bit<32>)meta.s.second | 1;  /* odd: the rows' cells differ (double hashing) */
                meta.s.mask = (1 << MB_SKETCH_BITS) - 1;
                meta.s.estimate = 0xffffffff;
                meta.s.cell_at = meta.s.first & meta.s.mask;
                sketch_cell();
                meta.s.cell_at = (1 << MB_SKETCH_BITS) | ((meta.s.first + meta.s.step) & meta.s.mask);
                sketch_cell();
                meta.s.cell_at = (2 << MB_SKETCH_BITS) | ((meta.s.first + 2 * meta.s.step) & meta.s.mask);
                sketch_cell();
                meta.s.cell_at = (3 << MB_SKETCH_BITS) | ((meta.s.first + 3 * meta.s.step) & meta.s.mask);
                sketch_cell();
                set32(meta.s.parity, (bit<32>)(meta.s.sketch_epoch & 1));
                meta.s.index = MB_MAX_SERVERS;
                if (meta.dest_known == 1) {
                    meta.s.index = meta.s.dest_server;
                }
                meta.s.index = meta.s.parity * (MB_MAX_SERVERS + 1) + meta.s.index;
                sketch_destinations.count(meta.s.index);
                meta.sketch_estimate = meta.s.estimate;
                sketch_report_step.apply();
                if (meta.s.estimate >= meta.s.report_from && (meta.s.estimate & meta.s.report_mask) == 0) {
                    sketch_digests.count(meta.s.parity);
                    digest<sketch_report_t>(MB_SKETCH_DIGEST, {meta.s.sketch_epoch, meta.s.estimate, hdr.ipv4.dst,
                                                               hdr.ports.dst, meta.k.len, meta.k.key});
                }
            }
        }
    }
}

/* set_mirror: a write to a hot key's home is counted in its slot (dirty) before it leaves for the home, and copied
 * to the controller. */
control MbSetMirror(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.key_mirrored") counter(MB_MAX_HOT, CounterType.packets) key_mirrored;  /* the twin of `writes` */
    apply {
        writes.read(meta.s.n64, meta.slot);
        meta.s.n64 = meta.s.n64 + 1;
        writes.write(meta.slot, meta.s.n64);
        key_mirrored.count(meta.slot);
        count(C_MIRRORED);
        meta.clone_it = meta.whole | meta.trusted;  /* else the unsure job clones it (once); the controller's own never
                                                     * make a server unsure, but are copied */
    }
}

/* hot_get: a single-key UDP get of a hot key goes home untouched if the key is dirty (writes or unsure requests
 * since the controller's sync), the lease ran out, or the chosen replica's memcached closed a connection of the
 * controller's it has not dealt with; else to a replica chosen by weight from a hash of the request id and client.
 * Decides meta.server_wanted, and meta.rewrite (REWRITE_GET: the rewrite job rewrites). */
control MbHotGet(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.key_gets") counter(MB_MAX_HOT, CounterType.packets) key_gets;
    @name(".MbIngress.key_home_while_dirty") counter(MB_MAX_HOT, CounterType.packets) key_home_while_dirty;

    @name(".MbIngress.synced_to") action synced_to(bit<64> written, bit<64> unsure_count) {
        meta.s.synced_writes = written;
        meta.s.synced_unsure = unsure_count;
    }
    @name(".MbIngress.synced")
    table synced {  /* per slot, what the controller synced the copies to; no entry: held dirty */
        key = { meta.slot: exact @name("meta.slot"); }
        actions = { synced_to; NoAction; }
        const default_action = NoAction;
        size = MB_MAX_HOT;
    }

    @name(".MbIngress.to_replica") action to_replica(bit<32> server, bit<32> position) {
        meta.s.replica = server;
        meta.s.replica_position = position;
        /* key_per_replica's index, here: computed next to the counter it would go through a compiler temporary */
        meta.s.index = meta.slot * MB_MAX_REPLICAS + position;
    }
    @name(".MbIngress.replicas")
    table replicas {  /* per slot, a range of the 16-bit hash per replica, as wide as its weight */
        key = { meta.slot: exact @name("meta.slot"); meta.point: range @name("meta.point"); }
        actions = { to_replica; NoAction; }
        const default_action = NoAction;
        size = MB_MAX_HOT * MB_MAX_REPLICAS;
    }

    @name(".MbIngress.handled_closes") action handled_closes(bit<64> count) { meta.s.handled = count; }
    @name(".MbIngress.closes_handled")
    table closes_handled {  /* per server, how many of its closes the controller has dealt with; no entry: none */
        key = { meta.server_wanted: exact @name("meta.checked_server"); }  /* (the replica chosen) */
        actions = { handled_closes; NoAction; }
        const default_action = NoAction;
        size = MB_MAX_SERVERS;
    }

    apply {
        key_gets.count(meta.slot);
        bit<48> now = std.ingress_global_timestamp;
        lease_until.read(meta.s.until, 0);
        writes.read(meta.s.written, meta.slot);
        unsure.read(meta.s.unsure_count, meta.s.home);
        /* clients address the home: unchanged is home */
        if (now >= meta.s.until) {
            count(C_LEASE_EXPIRED);
            key_home_while_dirty.count(meta.slot);
        } else if (!synced.apply().hit) {  /* no entry: held dirty */
            key_home_while_dirty.count(meta.slot);
        } else if (meta.s.synced_writes != meta.s.written || meta.s.synced_unsure != meta.s.unsure_count) {
            key_home_while_dirty.count(meta.slot);
        } else {
            mix(meta.s.h, ((bit<32>)hdr.frame.request_id | ((bit<32>)hdr.ports.src << 16)) ^ hdr.ipv4.src);
            set16(meta.point, meta.s.h[15:0]);
            meta.server_wanted = meta.s.home;
            meta.rewrite = REWRITE_GET;
            if (replicas.apply().hit) {
                meta.server_wanted = meta.s.replica;
            } else {
                meta.s.replica_position = NO_POSITION;  /* (the rewrite counts per replica: none) */
            }
            if (meta.server_wanted != meta.s.home) {  /* it may have lost its copy since the controller looked */
                meta.s.handled = 0;
                closes_handled.apply();
                closes.read(meta.s.closed, meta.server_wanted);
                if (meta.s.closed != meta.s.handled) {
                    meta.rewrite = REWRITE_NONE;  /* home, untouched */
                }
            }
        }
    }
}

/* A request the pipeline cannot read: its server unsure (a TCP one starts a stream: its copy is needed; a UDP one's
 * copies are coalesced) */
#define UNPARSED count(C_UNPARSED); meta.unsure_it = 1; meta.coalesce = (bit<1>)hdr.udp.isValid();

/* meta.whole: the payload is exactly this one command: its line ends with "\r\n", then its data block and "\r\n"
 * if it has one, then nothing */
#define WHOLE \
    if (meta.line_found == 1 && meta.bad_number == 0 && hdr.lf.isValid() && hdr.lf.b == 0x0a && \
            !(meta.command == CMD_READ && meta.changes == 1)) { \
        if (meta.s.data_field == MB_NO_DATA) { \
            meta.whole = (bit<1>)(meta.s.remaining == 0); \
        } else if (meta.fields > meta.s.data_field) { \
            meta.whole = (bit<1>)((bit<64>)meta.s.remaining == meta.number + 2); \
        } \
    }

/* A request to a memcached port: what it is (the command the parser read, proved whole or not, its key hot or
 * cold), and so what the jobs after this one do with it: balance it (hot get), count it in its slot (set mirror),
 * make its server unsure, count its key (sketch). A TCP connection read as a stream since a segment that was not
 * exactly one command stays unsure until a segment starts where the controller proved a command starts. */
control MbReadRequest(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.blind_streams")
    table blind_streams {  /* connections the controller cannot follow: their segments' copies are coalesced */
        key = { hdr.ipv4.src: exact; hdr.ports.src: exact; hdr.ipv4.dst: exact; hdr.ports.dst: exact; }
        actions = { NoAction; }
        const default_action = NoAction;
        size = 1 << MB_STREAM_BITS;
    }

    @name(".MbIngress.stream_resumes")
    table stream_resumes {  /* a command starts at this segment of this connection, as the controller proved */
        key = { hdr.ipv4.src: exact; hdr.ports.src: exact; hdr.ipv4.dst: exact; hdr.ports.dst: exact;
                hdr.tcp.seq: exact; }
        actions = { NoAction; }
        const default_action = NoAction;
        size = 1 << MB_STREAM_BITS;
    }

    @name(".MbIngress.hot") action hot(bit<32> slot, bit<32> home) {
        meta.slot = slot;
        meta.s.home = home;
    }
    @name(".MbIngress.hot_keys")
    table hot_keys {  /* the whole key: a cold key never matches */
        key = { meta.k.len: exact @name("meta.key_len"); meta.k.key: exact @name("meta.key"); }
        actions = { hot; NoAction; }
        const default_action = NoAction;
        size = MB_MAX_HOT;
    }

    MbSketch() sketching;
    MbHotGet() hot_get;
    MbSetMirror() set_mirror;

    apply {  /* (nested so that a get passes few conditions: each costs bmv2 per packet) */
        if (meta.l4 == 1) {
            count(C_MEMCACHED);
            if (hdr.tcp.isValid()) {
                if ((hdr.tcp.flags & (TCP_FIN | TCP_RST)) != 0 && meta.trusted == 1) {
                    /* the controller closes: the server's FIN will answer it */
                    CLOSING_SLOT(hdr.ipv4.src, hdr.ports.src, hdr.ipv4.dst, hdr.ports.dst)
                    set64(meta.s.stored, hdr.ipv4.src ++ hdr.ports.src ++ hdr.ports.dst);
                    closing.write(meta.s.h, meta.s.stored);
                }
                if ((hdr.ipv4.flags_frag & IP_BALANCED) == 0) {
                    stream_at(hdr.ipv4.src, hdr.ports.src, hdr.ipv4.dst, hdr.ports.dst,
                              meta.s.stream_slot, meta.s.stream_id);
                    stream_ids.read(meta.s.stored, meta.s.stream_slot);
                    /* a connection read as a stream: stopped knowing at stream_starts */
                    if (meta.s.stored == meta.s.stream_id) {
                        if (meta.s.payload_len > 0) {
                            if (stream_resumes.apply().hit) {
                                /* where a command starts: read on its own again */
                                stream_ids.write(meta.s.stream_slot, 0);
                            } else {
                                meta.mid_stream = 1;
                                meta.stream = 1;
                                stream_starts.read(meta.stream_start, meta.s.stream_slot);
                                if (blind_streams.apply().hit) {
                                    meta.coalesce = 1;
                                }
                            }
                        }
                        if ((hdr.tcp.flags & (TCP_FIN | TCP_RST)) != 0) {
                            stream_ids.write(meta.s.stream_slot, 0);
                        }
                    }
                }
            }
            if ((hdr.ipv4.flags_frag & IP_BALANCED) != 0) {
                count(C_ALREADY_BALANCED);
                if (hdr.udp.isValid() && hdr.frame.isValid()) {  /* a get another switch balanced: its IP ID
                                                                  * names the home (a fabric) */
                    meta.server_wanted = (bit<32>)hdr.ipv4.identification;
                    meta.rewrite = REWRITE_UPSTREAM;
                }
            } else if (meta.frame_ok == 1 || (hdr.tcp.isValid() && meta.mid_stream == 0 &&
                                              (meta.s.payload_len != 0 || meta.command != CMD_NONE))) {
                /* a datagram with a frame header, or a segment not in a stream and not a bare ACK: its command */
                if (meta.command >= CMD_GET && meta.command <= CMD_READ) {  /* get, a write, mg: a command with a key */
                    if (meta.s.command_len < 6 || meta.k.len == 0) {  /* (shorter than 6 bytes: the eBPF parser's
                                                                         * rule) */
                        UNPARSED
                    } else {
                        WHOLE
                        if (hot_keys.apply().hit) {
                            if (meta.command == CMD_GET && meta.whole == 1 && hdr.key_end.b == 0x0d) {
                                /* a single-key get, and nothing else (over TCP: to its home, untouched) */
                                if (hdr.udp.isValid()) {
                                    hot_get.apply(hdr, meta, std);
                                }
                            } else {
                                /* a write to the home is mirrored (the controller's own copy to a replica is
                                 * not); a read, a multi-key get or a write not proved whole: unsure */
                                if (meta.command == CMD_WRITE && meta.dest_known == 1 &&
                                        meta.s.dest_server == meta.s.home) {
                                    set_mirror.apply(hdr, meta, std);
                                }
                                meta.unsure_it = ~meta.whole;
                            }
                        } else if (meta.whole == 0) {  /* a read, or a write to a cold key, not proved whole */
                            meta.unsure_it = 1;
                        }
                        if (meta.command == CMD_GET) {
                            sketching.apply(hdr, meta, std);
                        }
                    }
                } else if (meta.command == CMD_NOOP) {  /* only "mn\r\n" (the eBPF parser's rule) */
                    if (!(meta.s.command_len == 4 && hdr.lf.isValid() && hdr.lf.b == 0x0a)) {
                        UNPARSED
                    }
                } else if (meta.command == CMD_LINE && meta.s.command_len >= 6) {
                    WHOLE
                    meta.unsure_it = ~meta.whole;
                } else {  /* not a command the pipeline reads */
                    UNPARSED
                }
            } else if (meta.mid_stream == 1) {
                meta.unsure_it = 1;  /* `mn\r\n` may be the last bytes of a value */
            } else if (hdr.udp.isValid() && meta.s.payload_len != 0) {  /* no frame header (an empty datagram:
                                                                          * nothing to read, nothing wrong) */
                UNPARSED
            }  /* (else a bare TCP ACK: nothing to read, nothing wrong) */
        } else if (meta.first_fragment == 1) {
            /* A request too big for one frame (a UDP set of a large value): the server applies it once every
             * fragment is in, after this first one passes, so marking its server unsure now is in time. */
            count(C_MEMCACHED);
            UNPARSED
        }
    }
}

/* A server's memcached closed a connection of the controller's: it may be dying or restarting, and whatever it
 * held may be gone by its next packet. No get is balanced to it and its hot keys are dirty (unsure) until the
 * controller has checked it; the controller gets a copy. The FIN that answers the controller's own close does not
 * count. */
control MbServerClosed(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.server_closes")
    counter(MB_MAX_SERVERS, CounterType.packets) server_closes;  /* the twin of `closes` */
    apply {
        CLOSING_SLOT(hdr.ipv4.dst, hdr.ports.dst, hdr.ipv4.src, hdr.ports.src)
        closing.read(meta.s.stored, meta.s.h);
        if (meta.s.stored == hdr.ipv4.dst ++ hdr.ports.dst ++ hdr.ports.src) {
            closing.write(meta.s.h, 0);  /* the answer to the controller's own close */
        } else {
            closes.read(meta.s.n64, meta.s.closing_server);
            meta.s.n64 = meta.s.n64 + 1;
            closes.write(meta.s.closing_server, meta.s.n64);
            server_closes.count(meta.s.closing_server);
            MAKE_UNSURE(meta.s.closing_server)
            meta.clone_it = 1;
        }
    }
}

/* A request to a server of the config that is not exactly one command the pipeline reads (and not the
 * controller's): its server is unsure, and a TCP one starts a stream (it may end inside a command). */
control MbUnsureRequest(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        if (meta.coalesce == 1) {
            MAKE_UNSURE_COALESCED(meta.s.dest_server)
        } else {
            MAKE_UNSURE(meta.s.dest_server)
            meta.clone_it = 1;
        }
        if (hdr.tcp.isValid() && meta.mid_stream == 0) {  /* it may end inside a command: a stream from here */
            stream_at(hdr.ipv4.src, hdr.ports.src, hdr.ipv4.dst, hdr.ports.dst, meta.s.stream_slot, meta.s.stream_id);
            stream_ids.write(meta.s.stream_slot, meta.s.stream_id);
            stream_starts.write(meta.s.stream_slot, hdr.tcp.seq);
            meta.stream = 1;
            meta.stream_start = hdr.tcp.seq;
        }
    }
}

/* reply_source, finding half: a datagram of the reply to a get this switch balanced (or saw balanced upstream)
 * leaves with the home's source; which home, the flow remembered says. */
control MbReplySource(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    apply {
        bit<64> id = hdr.ipv4.dst ++ hdr.ports.dst ++ hdr.frame.request_id;
        /* the get's flow (bmv2's own CRC: a mix in expressions costs it far more per packet) */
        FLOW_SLOT(hdr.ipv4.dst, hdr.ports.dst, hdr.frame.request_id)
        bit<32> at = meta.s.h;
        flow_ids.read(meta.s.stored, at);
        if (meta.s.stored == id) {
            flow_homes.read(meta.server_wanted, at);
            meta.s.keep_mac = meta.server_wanted[31:31];
            meta.server_wanted = meta.server_wanted & ~FLOW_UPSTREAM;
            meta.rewrite = REWRITE_REPLY;
        }
    }
}

/* The server found rewritten into the packet: a balanced get's destination (and its flow remembered, so its reply
 * leaves with the home's source), a reply's source; the flow of a get balanced upstream remembered here too.
 * Checksums are updated for the words that change (RFC 1624: HC' = ~(~HC + ~m + m')), by bmv2's own one's complement
 * sum (CSUM). */
control MbRewrite(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.key_per_replica")
    counter(MB_MAX_HOT * MB_MAX_REPLICAS, CounterType.packets) key_per_replica;  /* slot * 8 + position */
    apply {  /* applied once `servers` has found meta.server_wanted's address; meta.rewrite says which rewrite */
        if (meta.rewrite == REWRITE_GET) {  /* a balanced get: its destination */
            bit<32> chosen = meta.server_wanted;
            meta.hairpin = (bit<1>)(chosen != meta.s.home);
            if (meta.s.replica_position != NO_POSITION) {
                key_per_replica.count(meta.s.index);  /* (the index: the replicas entry's action) */
            }
            if (chosen != meta.s.home) {  /* remember the get, so its reply leaves with the home's source */
                FLOW_SLOT(hdr.ipv4.src, hdr.ports.src, hdr.frame.request_id)
                set64(meta.s.stored, hdr.ipv4.src ++ hdr.ports.src ++ hdr.frame.request_id);
                flow_ids.write(meta.s.h, meta.s.stored);
                flow_homes.write(meta.s.h, meta.s.home);
            }
            /* The home's index goes in the IP ID (a get is one unfragmented datagram, whose ID nothing reads), so
             * that a switch further on, the replica's, can make the reply seem to come from the home when the reply
             * does not pass this one (a fabric that balances at the home's leaf). */
            meta.c.setValid();
            if (hdr.udp.checksum != 0) {  /* 0: the sender sent none */
                meta.c.sum = hdr.udp.checksum;
                meta.c.ip = hdr.ipv4.dst;
                meta.c.w1 = hdr.ports.dst;
                meta.c.w2 = 0;
                CSUM(meta.s.csum)
                meta.c.sum = meta.s.csum;
                meta.c.ip = meta.s.server_ip;
                meta.c.w1 = meta.s.server_port;
                CSUM(hdr.udp.checksum)
                if (hdr.udp.checksum == 0) {
                    hdr.udp.checksum = 0xffff;  /* 0 says "none" */
                }
            }
            meta.c.sum = hdr.ipv4.checksum;
            meta.c.ip = hdr.ipv4.dst;
            meta.c.w1 = hdr.ipv4.flags_frag;
            meta.c.w2 = hdr.ipv4.identification;
            CSUM(meta.s.csum)
            meta.c.sum = meta.s.csum;
            meta.c.ip = meta.s.server_ip;
            meta.c.w1 = hdr.ipv4.flags_frag | IP_BALANCED;
            meta.c.w2 = meta.s.home[15:0];
            CSUM(hdr.ipv4.checksum)
            hdr.ipv4.dst = meta.s.server_ip;
            hdr.ipv4.flags_frag = meta.c.w1;
            hdr.ipv4.identification = meta.c.w2;
            hdr.ports.dst = meta.s.server_port;
            hdr.ethernet.dst = meta.s.server_mac;
            count(C_BALANCED);
        } else if (meta.rewrite == REWRITE_REPLY) {  /* a reply to a balanced get: its source */
            if (meta.s.server_ip != hdr.ipv4.src || meta.s.server_port != hdr.ports.src) {
                meta.c.setValid();  /* (zeroed: w1 and w2 are 0 until set) */
                meta.c.sum = hdr.ipv4.checksum;
                meta.c.ip = hdr.ipv4.src;
                CSUM(meta.s.csum)
                meta.c.sum = meta.s.csum;
                meta.c.ip = meta.s.server_ip;
                CSUM(hdr.ipv4.checksum)
                if (hdr.udp.checksum != 0) {
                    meta.c.sum = hdr.udp.checksum;
                    meta.c.ip = hdr.ipv4.src;
                    meta.c.w1 = hdr.ports.src;
                    CSUM(meta.s.csum)
                    meta.c.sum = meta.s.csum;
                    meta.c.ip = meta.s.server_ip;
                    meta.c.w1 = meta.s.server_port;
                    CSUM(hdr.udp.checksum)
                    if (hdr.udp.checksum == 0) {
                        hdr.udp.checksum = 0xffff;  /* 0 says "none" */
                    }
                }
                hdr.ipv4.src = meta.s.server_ip;
                hdr.ports.src = meta.s.server_port;
                if (meta.s.keep_mac == 0) {
                    hdr.ethernet.src = meta.s.server_mac;
                }
                count(C_REPLIES_REWRITTEN);
            }
        } else if (meta.s.server_ip != hdr.ipv4.dst) {  /* REWRITE_UPSTREAM: a get another switch balanced */
            /* the reply leaves the replica through this switch first, maybe never through the one that balanced
             * the get: remember the home here too, marked, so the reply gets the home's IP and port here */
            FLOW_SLOT(hdr.ipv4.src, hdr.ports.src, hdr.frame.request_id)
            set64(meta.s.stored, hdr.ipv4.src ++ hdr.ports.src ++ hdr.frame.request_id);
            flow_ids.write(meta.s.h, meta.s.stored);
            set32(meta.s.index, (bit<32>)hdr.ipv4.identification | FLOW_UPSTREAM);
            flow_homes.write(meta.s.h, meta.s.index);
        }
    }
}

/* Flood an unknown or multicast destination. */
#define FLOOD count(C_FLOODED); std.mcast_grp = MB_FLOOD_GROUP;
/* A destination behind the port the frame came in by is dropped; but a rewritten get may go back the way it came
 * (a fabric's home leaf sends it up to a spine again). */
#define DROP_IF_BEHIND_INGRESS \
    if (std.egress_spec == std.ingress_port && meta.hairpin == 0) { count(C_DROPPED); mark_to_drop(std); }

/* forward: the controller's entry, else the learned port, else flood. */
control MbForward(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    @name(".MbIngress.to_port") action to_port(bit<9> port) { std.egress_spec = port; }
    @name(".MbIngress.forward")
    table forward {  /* destination MAC -> port, set by the controller (before what was learned) */
        key = { hdr.ethernet.dst: exact; }
        actions = { to_port; NoAction; }
        const default_action = NoAction;
        size = 4096;
    }

    apply {
        if (!hdr.ethernet.isValid()) {
            mark_to_drop(std);
            return;
        }
        if (hdr.ethernet.dst[40:40] == 1) {  /* multicast, broadcast */
            FLOOD
        } else if (forward.apply().hit) {
            DROP_IF_BEHIND_INGRESS
        } else {
            LEARN_SLOT(hdr.ethernet.dst)
            learned_macs.read(meta.s.mac, meta.s.h);
            if (meta.s.mac == hdr.ethernet.dst) {
                learned_ports.read(std.egress_spec, meta.s.h);
                DROP_IF_BEHIND_INGRESS
            } else {
                FLOOD
            }
        }
    }
}

/* The ingress: one job per control above, in this order; each reads what the ones before it decided (metadata).
 * (The instances are not named as any object inside them: those keep their own names, MbIngress.<name>.) */
control MbIngress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    MbControllerOps() controller_ops;
    MbLearn() learn;
    MbClassify() classify;
    MbReadRequest() read_request;
    MbServerClosed() server_closed;
    MbUnsureRequest() unsure_request;
    MbReplySource() reply_source;
    MbRewrite() rewrite;
    MbForward() forwarding;

    action clone_to_controller() {
        clone_preserving_field_list(CloneType.I2E, (bit<32>)MB_MIRROR_SESSION, MB_COPY_FIELDS);
    }

    action server_address(bit<48> mac, bit<32> ip, bit<16> port) {
        meta.s.server_mac = mac;
        meta.s.server_ip = ip;
        meta.s.server_port = port;
    }
    table servers {  /* server index -> MAC, IP, port: the server a get goes to, a reply comes from */
        key = { meta.server_wanted: exact @name("meta.server_wanted"); }
        actions = { server_address; NoAction; }
        const default_action = NoAction;
        size = MB_MAX_SERVERS;
    }

    apply {
        if (hdr.packet_out.isValid()) {  /* from the controller */
            controller_ops.apply(hdr, meta, std);
            return;
        }
        count(C_PACKETS);
        learn.apply(hdr, meta, std);
        classify.apply(hdr, meta, std);
        /* (each kind of packet down its own branch: a get passes few conditions, each costs bmv2 per packet) */
        if (meta.request == 1) {
            read_request.apply(hdr, meta, std);  /* (with the hot get, mirror and sketch jobs of what it reads) */
            if (meta.unsure_it == 1 || meta.clone_it == 1) {  /* a request the jobs below have to deal with (one
                                                                 * condition for a get that has none) */
                if (meta.unsure_it == 1 && meta.dest_known == 1 && meta.trusted == 0) {
                    unsure_request.apply(hdr, meta, std);
                }
                if (meta.clone_it == 1) {
                    clone_to_controller();
                }
            }
        } else if (meta.reply == 1) {
            if (hdr.frame.isValid()) {
                reply_source.apply(hdr, meta, std);
            }
        } else if (meta.server_closed == 1) {
            server_closed.apply(hdr, meta, std);
            if (meta.clone_it == 1) {
                clone_to_controller();
            }
        }
        if (meta.rewrite != REWRITE_NONE) {  /* a server to rewrite into the packet: the jobs above chose it */
            if (servers.apply().hit) {
                rewrite.apply(hdr, meta, std);
            }  /* (no address: the packet leaves as it is) */
        }
        forwarding.apply(hdr, meta, std);
    }
}

control MbEgress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    counter(1, CounterType.packets) cloned;
    apply {
        /* (one condition for a plain unicast packet, not three: each costs bmv2 per packet) */
        if (std.instance_type != 0 || std.mcast_grp != 0 || hdr.packet_out.isValid()) {
            if (hdr.packet_out.isValid()) {  /* an answer to the controller: a rearm's, a lease query's */
                hdr.packet_in.setValid();
                hdr.packet_in.report = meta.s.report;
                hdr.packet_in.quiet_us = meta.s.quiet_us;
            } else if (std.instance_type == 1) {  /* the ingress clone: to the controller, as a PacketIn */
                hdr.packet_in.setValid();
                hdr.packet_in.ingress_port = (bit<16>)std.ingress_port;
                hdr.packet_in.stream_start = meta.stream_start;
                hdr.packet_in.stream = meta.stream;
                cloned.count(0);
            } else if (std.mcast_grp != 0 && std.egress_port == std.ingress_port && meta.hairpin == 0) {
                mark_to_drop(std);  /* flooding: not back out of the port it came in on (but a balanced get may go
                                     * back: its new destination can be behind that port, as a fabric's replica is) */
            }
        }
    }
}

control MbComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

V1Switch(MbParser(), MbVerifyChecksum(), MbIngress(), MbEgress(), MbComputeChecksum(), MbDeparser()) main;
