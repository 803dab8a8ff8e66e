#!/usr/bin/env python3
"""Fits the cascade cost model (src/scheduler/cascade_cost.h) to `flashkv bench cascade` rows.

usage: python3 bench/cascade_cost_fit.py bench/results/cascade-2026-12-02-2b1fc0a.json [start.json]
Pure Python (no numpy): Nelder-Mead on the log parameters. Loss: squared log error of both paths'
estimates over all rows, plus W x a penalty where the estimate is on the wrong side of (or within
MARG of) the measured faster path, for configurations whose paths differ by more than 3 %. The
model below mirrors cascade_cost.cpp for the bench's layouts (one shared group of n requests,
suffixes spread evenly over [suffix_min, suffix_max]). Prints the parameters and the misses.
Units: TB/s (bd, bl, bp), TFLOP/s (Ftc, Fmma), MB (l2mb), us."""
import json, math, sys

def feats(r):
    tb = 2*r['num_kv_heads']*r['head_dim']*2  # f16 bytes per token
    n=r['n']; P=r['prefix_tokens']; S=r['suffix_tokens']
    U=(P+S)*tb if n>1 else (P+S)*tb
    plain_bytes=(n*P+S)*tb
    R=plain_bytes-U
    g=r['num_qo_heads']//r['num_kv_heads']
    rows_kv=n*g  # prefix-pass rows per kv head
    flops=4.0*n*r['num_qo_heads']*P*r['head_dim']
    return dict(tb=tb,n=n,P=P,S=S,U=U,R=R,Pb=P*tb,Sb=S*tb,g=g,rows_kv=rows_kv,flops=flops,D=r['head_dim'],Hq=r['num_qo_heads'],Hkv=r['num_kv_heads'])

def nelder_mead(f, x0, step=0.3, iters=4000, tol=1e-10):
    n=len(x0); pts=[list(x0)]
    for i in range(n):
        p=list(x0); p[i]+=step; pts.append(p)
    vals=[f(p) for p in pts]
    for it in range(iters):
        order=sorted(range(n+1),key=lambda i:vals[i]); pts=[pts[i] for i in order]; vals=[vals[i] for i in order]
        if abs(vals[-1]-vals[0])<tol: break
        c=[sum(p[j] for p in pts[:-1])/n for j in range(n)]
        xr=[c[j]+(c[j]-pts[-1][j]) for j in range(n)]; fr=f(xr)
        if fr<vals[0]:
            xe=[c[j]+2*(c[j]-pts[-1][j]) for j in range(n)]; fe=f(xe)
            if fe<fr: pts[-1],vals[-1]=xe,fe
            else: pts[-1],vals[-1]=xr,fr
        elif fr<vals[-2]: pts[-1],vals[-1]=xr,fr
        else:
            xc=[c[j]+0.5*(pts[-1][j]-c[j]) for j in range(n)]; fc=f(xc)
            if fc<vals[-1]: pts[-1],vals[-1]=xc,fc
            else:
                for i in range(1,n+1):
                    pts[i]=[pts[0][j]+0.5*(pts[i][j]-pts[0][j]) for j in range(n)]; vals[i]=f(pts[i])
    i=min(range(n+1),key=lambda i:vals[i]); return pts[i],vals[i]
def fit(f,x0,restarts=6,step=0.3):
    x,v=x0,None
    for r in range(restarts):
        x,v=nelder_mead(f,x,step=step)
    return x,v

C=dict(sms=132, decode_ctas=264, mis_tokens=512, tc_max_d=128)
def tile_rows(rows_kv):
    for t in (16,32,64,128):
        if rows_kv<=t: return t
    return 128
def kdec(p,D): return p['k64'] if D<=64 else (1.0 if D<=128 else p['k256'])
def kpre(p,D): return p['pk64'] if D<=64 else (1.0 if D<=128 else p['pk256'])
def suffixes(r):
    n=r['n']; lo,hi=r['suffix_min'],r['suffix_max']
    return [lo+(hi-lo)*i//(n-1 if n>1 else 1) for i in range(n)]
def plain(p,f,r):
    a=f['U']/(p['bd']*1e6); b=(f['U']+f['R'])/(p['bl']*1e6); q=p['pw']
    t=(a**q+b**q)**(1/q)
    mis=0
    if f['n']>1:
        s=suffixes(r); spread=max(s)-min(s)
        mis=f['Pb']*min(1.0,spread/C['mis_tokens'])*min(1.0,f['Pb']/(p['l2mb']*1e6))*p['mis']/(p['bd']*1e6)
    return p['p0']+kdec(p,f['D'])*(t+mis)
def casc(p,f,r):
    g=f['g']; n=f['n']; D=f['D']; Hkv=f['Hkv']
    t=tile_rows(n*g)  # choose_query_tile_rows: avg rows n, x group
    tt=t//g; ntiles=-(-n//tt)
    tc=(t==128 and D<=C['tc_max_d'])
    ctas=C['sms']*(1 if tc else 2)
    T=ntiles*Hkv*f['P']
    L=max(128,-(-T//ctas)); chunks=-(-f['P']//L)
    rows_tile=min(n*g,t)
    stream=kpre(p,D)*f['Pb']/(p['bp']*1e6)+f['flops']/((p['Ftc'] if tc else p['Fmma'])*1e6)
    merge=chunks*ntiles*(p['mtc'] if tc else p['mrow']*rows_tile)*D/128
    s=suffixes(r); Ts=sum(s)*Hkv; Ls=max(128,Ts/C['decode_ctas'])
    suf=kdec(p,D)*f['Sb']/(p['bd']*1e6)+(p['ssplit'] if max(s)>Ls else 0)
    st=5*n*f['Hq']*(D+1)*4/(p['bd']*1e6)
    return p['c0']+stream+merge+suf+st+p['crow']*n
NAMES=['p0','bd','bl','pw','k64','k256','mis','l2mb','c0','bp','Ftc','Fmma','mtc','mrow','pk64','pk256','crow','ssplit']


def main():
    doc = json.load(open(sys.argv[1]))
    rows = doc["cascade"] if isinstance(doc, dict) else doc
    data = [(feats(r), r) for r in rows]
    W, MARG = 300.0, 0.025
    unpack = lambda x: {k: math.exp(v) for k, v in zip(NAMES, x)}

    def penalty(p):
        pen = 0
        for f, r in data:
            if r["n"] == 1:
                continue
            est = math.log(casc(p, f, r) / plain(p, f, r))
            meas = math.log(r["cascade_us"] / r["plain_us"])
            if meas > 0.03 and est < MARG:
                pen += meas * (MARG - est)
            if meas < -0.03 and est > -MARG:
                pen += -meas * (est + MARG)
        return pen

    def loss(x):
        p = unpack(x)
        l = 0
        for f, r in data:
            l += math.log(plain(p, f, r) / r["plain_us"]) ** 2
            if r["n"] > 1:
                l += math.log(casc(p, f, r) / r["cascade_us"]) ** 2
        return l + W * penalty(p)

    start = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else START
    x, _ = fit(loss, [math.log(start[k]) for k in NAMES], restarts=3)
    p = unpack(x)
    print(json.dumps(p, indent=1))
    for f, r in data:
        if r["n"] == 1:
            continue
        use = casc(p, f, r) < plain(p, f, r)
        chosen = r["cascade_us"] if use else r["plain_us"]
        slow = chosen / min(r["plain_us"], r["cascade_us"]) - 1
        if slow > 0.03:
            print("miss", r["shape"], r["suffix_min"], r["n"], r["prompt"], f"{100 * slow:.1f} %")


# The fitted defaults (cascade_cost.h).
START = {"p0": 9.701812808063499, "bd": 4.6056846316287965, "bl": 9.427097907392325, "pw": 1.9733085321560102, "k64": 1.3298503581538363, "k256": 2.6020135548991115, "mis": 0.521990294868576, "l2mb": 117.99492830815787, "c0": 22.427424638203384, "bp": 3.5459808168728584, "Ftc": 983.0761078076251, "Fmma": 737.6384176890364, "mtc": 1.5763894807492456, "mrow": 0.01592102584368451, "pk64": 0.7625841995401096, "pk256": 2.0093495025672627, "crow": 0.00066333636657804, "ssplit": 6.937940089389934}

if __name__ == "__main__":
    main()
