# The byte-exact Python emulation of packs.cuh issue_row_at / finish_row_at / store_row_from (twenty-fifth
# session, bench/NOTES.md v27), run on the CPU before call 1: `python3 realign_emulation.py` -> "ok 3000".
import random
def realign_any(a, b, s):  # 16 bytes starting s into a, then b
    return (a + b)[s:s + 16]
Z = bytes(16)
def lanes(G, kPacks):
    W = 32 if G >= 32 else G
    out = []
    for lane in range(G):
        j = lane % W; seg = lane // W
        out.append(dict(lane=lane, j=j, W=W, base=seg * W * kPacks + j, seg_end=(seg + 1) * W * kPacks, seg=seg))
    return out
def issue_finish(mem, row_addr, H, es, phase, realign, G, kPacks):
    L = lanes(G, kPacks); W = L[0]['W']
    offset = row_addr & 15
    start = 16 + offset if (realign and offset < phase) else offset
    base = row_addr - start
    first = start >> 4
    chunks = (start + H * es + 15) // 16
    ld = lambda p: bytes(mem[base + 16 * p: base + 16 * p + 16]) if first <= p < chunks else Z
    st = []
    for l in L:
        buf = [ld(l['base'] + i * W) for i in range(kPacks)]
        last = l['j'] == W - 1
        ext = ld(l['seg_end']) if last and l['seg_end'] < chunks else Z
        ext2 = ld(l['seg_end'] + 1) if realign and last and l['seg_end'] + 1 < chunks else Z
        st.append([buf, ext, ext2])
    end = start + H * es
    # mask_row_end: chunk of the row's last byte, slots or ext (or ext2 realigning)
    lastc = (end - 1) // 16 if end > 0 else 0; keep = end - 16 * lastc
    if keep != 16:
        for l, s in zip(L, st):
            m = lambda c: c[:keep] + bytes(16 - keep)
            for i in range(kPacks):
                if l['base'] + i * W == lastc: s[0][i] = m(s[0][i])
            if l['j'] == W - 1 and lastc == l['seg_end']: s[1] = m(s[1])
            if realign and l['j'] == W - 1 and lastc == l['seg_end'] + 1: s[2] = m(s[2])
    if realign:
        shift = start - phase
        assert 0 <= shift < 16
        new = []
        for idx, (l, s) in enumerate(zip(L, st)):
            seg0 = idx - l['j']
            nb = []
            for i in range(kPacks):
                if l['j'] + 1 < W: nxt = st[idx + 1][0][i]
                else:
                    nxt = st[seg0][0][i + 1] if i + 1 < kPacks else s[1]
                nb.append(realign_any(s[0][i], nxt, shift))
            new.append([nb, realign_any(s[1], s[2], shift)])
        st = [[a, b, None] for a, b in new]
    return L, st
def check_in(mem, row_addr, H, es, phase, L, st, kPacks):
    W = L[0]['W']
    rowb = bytes(mem[row_addr: row_addr + H * es])
    def expect(q):  # phase-space chunk q, None for unknown bytes (before the row)
        out = []
        for k in range(16):
            b = 16 * q + k - phase
            out.append(rowb[b] if 0 <= b < len(rowb) else (0 if b >= len(rowb) else None))
        return out
    for l, s in zip(L, st):
        for i in range(kPacks):
            q = l['base'] + i * W
            e = expect(q)
            for k in range(16):
                if e[k] is not None and e[k] != s[0][i][k]: return f"lane {l['lane']} slot {i} q {q} byte {k}"
        if l['j'] == W - 1:
            e = expect(l['seg_end'])
            for k in range(16):
                if e[k] is not None and e[k] != s[1][k]: return f"ext lane {l['lane']} byte {k}"
    return None
def store_from(mem, row_addr, H, es, phase, L, vals, vext, kPacks):
    W = L[0]['W']; G = len(L)
    writes = {}
    to = row_addr & 15; dst = row_addr - to
    end = to + H * es; chunks = (end + 15) // 16
    shift = (phase - to) & 15; up = 1 if phase < to else 0
    nseg = G // W
    def put(q, v, lo, hi):
        for k in range(max(lo, 0), min(hi, 16)):
            a = dst + 16 * q + k
            writes.setdefault(a, []).append(v[k])
    for idx, l in enumerate(L):
        seg0 = idx - l['j']; last_segment = l['seg'] == nseg - 1
        for i in range(kPacks):
            if l['j'] + 1 < W: nxt = vals[idx + 1][i]
            else: nxt = vals[seg0][i + 1] if i + 1 < kPacks else vext[idx]
            seg_last = l['j'] == W - 1 and i + 1 == kPacks
            q = l['base'] + i * W + up
            if q >= chunks: continue
            hi = min(16 - shift if (seg_last and not last_segment) else 16, end - 16 * q)
            lo = to if q == 0 else 0
            put(q, realign_any(vals[idx][i], nxt, shift), lo, hi)
        head = l['base'] + up - 1
        if l['j'] == 0 and shift != 0 and head >= 0:
            put(head, realign_any(vals[idx][0], vals[idx][0], shift), max(16 - shift, to if head == 0 else 0), min(16, end - 16 * head))
        if last_segment and l['j'] == W - 1 and l['seg_end'] + up < chunks:
            q = l['seg_end'] + up
            put(q, realign_any(vext[idx], vext[idx], shift), to if q == 0 else 0, min(16, end - 16 * q))
    return writes
def run(trials=3000):
    rnd = random.Random(1)
    for t in range(trials):
        es = rnd.choice([2, 4, 8]); kPacks = rnd.choice([1, 2, 3, 4, 7, 8])
        G = rnd.choice([1, 2, 4, 8, 16, 32, 64, 96, 128])
        vec = 16 // es
        slots = G * kPacks
        # H such that slot_packs(H) <= slots
        while True:
            H = rnd.randint(1, slots * vec + 1)
            whole = (H * es) % 16 == 0
            sp = H * es // 16 if whole else ((H - 1) * es + 15) // 16
            if sp <= slots: break
        src_off = rnd.randrange(0, 16, es); phase = rnd.randrange(0, 16, es); to = rnd.randrange(0, 16, es)
        mem = bytearray(rnd.getrandbits(8) for _ in range(64 + 16 * (slots + 4) + H * es))
        row_addr = 32 + src_off
        realign = src_off != phase or rnd.random() < 0.2
        L, st = issue_finish(mem, row_addr, H, es, phase, realign, G, kPacks)
        err = check_in(mem, row_addr, H, es, phase, L, st, kPacks)
        if err: print("IN", dict(es=es, kPacks=kPacks, G=G, H=H, off=src_off, phase=phase, realign=realign), err); return
        # store: the phase-space chunks (ext only for last segment's last lane) out to `to`
        vals = [s[0] for s in st]
        nseg = G // L[0]['W']
        vext = [s[1] if (l['j'] == l['W'] - 1 and l['seg'] == nseg - 1) else Z for l, s in zip(L, st)]
        out_addr = 1024 * 64 + to
        w = store_from(None, out_addr, H, es, phase, L, vals, vext, kPacks)
        rowb = bytes(mem[row_addr: row_addr + H * es])
        for a, v in w.items():
            if len(v) != 1: print("MULTI", a - out_addr, dict(es=es, kPacks=kPacks, G=G, H=H, phase=phase, to=to)); return
            b = a - out_addr
            if not (0 <= b < H * es): print("OUTSIDE", b, dict(es=es, kPacks=kPacks, G=G, H=H, phase=phase, to=to)); return
            if v[0] != rowb[b]: print("WRONG", b, dict(es=es, kPacks=kPacks, G=G, H=H, phase=phase, to=to)); return
        if len(w) != H * es: print("MISSING", H * es - len(w), dict(es=es, kPacks=kPacks, G=G, H=H, phase=phase, to=to)); return
    print("ok", trials)
run()
