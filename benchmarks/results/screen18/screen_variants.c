/* The span screen alone and variants of it, on bench_connector's filter and an 8K-token miss and hit target (screen18).
 *   python benchmarks/results/screen18/screen_data.py DIR && cc -O2 -I semblend_dynamo/_native \
 *     benchmarks/results/screen18/screen_variants.c -o /tmp/sv && /tmp/sv DIR
 * Best of 3,000 calls (µs, and TSC ticks a window): cur (the checkout's screen_of), 8lanes (eight rolling hashes),
 * tables (prefix sums with power tables: two multiplies a window), roll_only / roll_mix (the four-lane roll without the
 * filter, without and with the mix multiply), blk (blocks of hashes, then each lane's block screened, branch-free
 * first bit), scr4 / scr3 / scr2 (four, three, two lanes, filter read as 64-bit words, rows by moving pointers),
 * scr4c (the first bit branch-free into a candidate list). x86 only (rdtsc). */
#include "span_aligner.c" /* cc -O2 -I semblend_dynamo/_native */
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double now(void){struct timespec ts; clock_gettime(CLOCK_MONOTONIC,&ts); return ts.tv_sec*1e9+ts.tv_nsec;}

/* roll only, 4 lanes: how much is the roll */
__attribute__((noinline)) uint64_t roll_only(const uint32_t *t, int64_t n, int64_t anchor, int lanes_unused) {
    int width=4; int64_t windows=n-anchor+1, q=windows/4;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    uint64_t h0=window_hash(t,4,0,anchor),h1=window_hash(t,4,q,anchor),h2=window_hash(t,4,2*q,anchor),h3=window_hash(t,4,3*q,anchor);
    uint64_t acc=0;
    for (int64_t i=0;i+1<q;i++){ acc += h0^h1^h2^h3; ROLL_LANES(h0,h1,h2,h3,i);} 
    return acc;
}
/* roll + mix, no filter load */
__attribute__((noinline)) uint64_t roll_mix(const uint32_t *t, int64_t n, int64_t anchor, const sa_table *tb) {
    int width=4; int64_t windows=n-anchor+1, q=windows/4;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    uint64_t h0=window_hash(t,4,0,anchor),h1=window_hash(t,4,q,anchor),h2=window_hash(t,4,2*q,anchor),h3=window_hash(t,4,3*q,anchor);
    uint64_t acc=0;
    for (int64_t i=0;i+1<q;i++){ acc += ((h0*MIX)>>tb->filter_shift)^((h1*MIX)>>tb->filter_shift)^((h2*MIX)>>tb->filter_shift)^((h3*MIX)>>tb->filter_shift); ROLL_LANES(h0,h1,h2,h3,i);} 
    return acc;
}

/* 8 lanes */
#define ROLL1(h, off, at) h = (h - token(t, (off)+(at), width)) * base_inv + token(t, (off)+(at) + anchor, width) * top
__attribute__((noinline)) int64_t screen8(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed) {
    int width=4; int64_t windows=n-anchor+1, q=windows/8;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    const uint8_t *bits=tb->bits; const uint64_t shift=tb->filter_shift; uint64_t h[8]; uint64_t *out[8]; int64_t c[8];
    for(int k=0;k<8;k++){h[k]=window_hash(t,4,k*q,anchor); out[k]=passed+2*k*q; c[k]=0;}
    uint64_t h0=h[0],h1=h[1],h2=h[2],h3=h[3],h4=h[4],h5=h[5],h6=h[6],h7=h[7];
    int64_t c0=0,c1=0,c2=0,c3=0,c4=0,c5=0,c6=0,c7=0;
    for (int64_t i=0;;i++){
        SCREEN(out[0],i,h0); SCREEN(out[1],q+i,h1); SCREEN(out[2],2*q+i,h2); SCREEN(out[3],3*q+i,h3);
        SCREEN(out[4],4*q+i,h4); SCREEN(out[5],5*q+i,h5); SCREEN(out[6],6*q+i,h6); SCREEN(out[7],7*q+i,h7);
        if (i+1==q) break;
        ROLL1(h0,0,i);ROLL1(h1,q,i);ROLL1(h2,2*q,i);ROLL1(h3,3*q,i);ROLL1(h4,4*q,i);ROLL1(h5,5*q,i);ROLL1(h6,6*q,i);ROLL1(h7,7*q,i);
    }
    return c0+c1+c2+c3+c4+c5+c6+c7;
}

/* power tables: m(i) = (P[i+A]-P[i]) * invmix[i], P prefix of t*pow */
__attribute__((noinline)) int64_t screen_tab(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed, const uint64_t *pw, const uint64_t *invmix, uint64_t *P) {
    int64_t windows=n-anchor+1; int64_t c=0;
    uint64_t s=0; P[0]=0;
    for (int64_t k=0;k<n;k++){ s += (uint64_t)t[k]*pw[k]; P[k+1]=s; }
    for (int64_t i=0;i<windows;i++){
        uint64_t m=(P[i+anchor]-P[i])*invmix[i];
        uint64_t slot = m >> tb->filter_shift;
        if ((tb->bits[slot>>3]>>(slot&7))&1) { uint64_t second = (slot & ~(uint64_t)511) | ((m >> (tb->filter_shift - 9)) & 511);
           if ((tb->bits[second>>3]>>(second&7))&1) {passed[2*c]=i; passed[2*c+1]=m; c++;} }
    }
    return c;
}


/* blocks: phase A rolls 4 lanes BLK windows into hs, phase B screens each lane's block in order */
#ifndef BLK
#define BLK 64
#endif
__attribute__((noinline)) int64_t screen_blk(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed) {
    const int width=4; int64_t windows=n-anchor+1, q=windows/4;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    const uint8_t *bits = tb->bits; const uint64_t shift = tb->filter_shift;
    uint64_t hs[4][BLK]; uint16_t cand[BLK];
    uint64_t *out[4] = {passed, passed+2*q, passed+4*q, passed+6*q};
    uint64_t *o[4] = {out[0],out[1],out[2],out[3]};
    uint64_t h0=window_hash(t,4,0,anchor),h1=window_hash(t,4,q,anchor),h2=window_hash(t,4,2*q,anchor),h3=window_hash(t,4,3*q,anchor);
    for (int64_t i0=0;i0<q;i0+=BLK){
        int64_t m = q-i0 < BLK ? q-i0 : BLK;
        for (int64_t j=0;j<m;j++){
            hs[0][j]=h0; hs[1][j]=h1; hs[2][j]=h2; hs[3][j]=h3;
            int64_t at=i0+j;
            if (at+1<q) ROLL_LANES(h0,h1,h2,h3,at);
        }
        for (int k=0;k<4;k++){
            int nc=0;
            for (int64_t j=0;j<m;j++){
                uint64_t slot=(hs[k][j]*MIX)>>shift;
                cand[nc]=(uint16_t)j; nc += (bits[slot>>3]>>(slot&7))&1;
            }
            uint64_t *ok=o[k];
            for (int c=0;c<nc;c++){
                int64_t j=cand[c]; uint64_t h=hs[k][j]; uint64_t mixed=h*MIX; uint64_t slot=mixed>>shift;
                uint64_t second = (slot & ~(uint64_t)511) | ((mixed >> (shift - 9)) & 511);
                if ((bits[second>>3]>>(second&7))&1){ ok[0]=(uint64_t)(k*q+i0+j); ok[1]=h; ok+=2; }
            }
            o[k]=ok;
        }
    }
    int64_t tot=0; for(int k=0;k<4;k++) tot+=(o[k]-out[k])/2;
    return tot;
}


ALWAYS_INLINE uint64_t pass1(const uint8_t *bits, uint64_t shift, uint64_t m) {
    uint64_t slot = m >> shift, w;
    memcpy(&w, bits + 8 * (slot >> 6), 8);
    return (w >> (slot & 63)) & 1;
}
ALWAYS_INLINE uint64_t pass2(const uint8_t *bits, uint64_t shift, uint64_t m) {
    uint64_t slot = m >> shift;
    uint64_t second = (slot & ~(uint64_t)511) | ((m >> (shift - 9)) & 511), w;
    memcpy(&w, bits + 8 * (second >> 6), 8);
    return (w >> (second & 63)) & 1;
}
#define SCR(o, pos, h) do { uint64_t m_ = (h) * MIX; if (pass1(bits, shift, m_) && pass2(bits, shift, m_)) { (o)[0] = (uint64_t)(pos); (o)[1] = (h); (o) += 2; } } while (0)
#define RL(h, off, at) h = (h - t[(off) + (at)]) * base_inv + (uint64_t)t[(off) + (at) + anchor] * top

__attribute__((noinline)) int64_t scr4(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed) {
    int64_t windows=n-anchor+1, q=windows/4;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    const uint8_t *bits = tb->bits; const uint64_t shift = tb->filter_shift;
    uint64_t h0=window_hash(t,4,0*q,anchor); uint64_t *o0=passed+2*0*q;uint64_t h1=window_hash(t,4,1*q,anchor); uint64_t *o1=passed+2*1*q;uint64_t h2=window_hash(t,4,2*q,anchor); uint64_t *o2=passed+2*2*q;uint64_t h3=window_hash(t,4,3*q,anchor); uint64_t *o3=passed+2*3*q;
    for (int64_t i=0;;i++){ SCR(o0,0*q+i,h0);SCR(o1,1*q+i,h1);SCR(o2,2*q+i,h2);SCR(o3,3*q+i,h3); if (i+1==q) break; RL(h0,0*q,i);RL(h1,1*q,i);RL(h2,2*q,i);RL(h3,3*q,i); }
    return (o0-passed-2*0*q)/2+(o1-passed-2*1*q)/2+(o2-passed-2*2*q)/2+(o3-passed-2*3*q)/2; }
__attribute__((noinline)) int64_t scr3(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed) {
    int64_t windows=n-anchor+1, q=windows/3;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    const uint8_t *bits = tb->bits; const uint64_t shift = tb->filter_shift;
    uint64_t h0=window_hash(t,4,0*q,anchor); uint64_t *o0=passed+2*0*q;uint64_t h1=window_hash(t,4,1*q,anchor); uint64_t *o1=passed+2*1*q;uint64_t h2=window_hash(t,4,2*q,anchor); uint64_t *o2=passed+2*2*q;
    for (int64_t i=0;;i++){ SCR(o0,0*q+i,h0);SCR(o1,1*q+i,h1);SCR(o2,2*q+i,h2); if (i+1==q) break; RL(h0,0*q,i);RL(h1,1*q,i);RL(h2,2*q,i); }
    return (o0-passed-2*0*q)/2+(o1-passed-2*1*q)/2+(o2-passed-2*2*q)/2; }
__attribute__((noinline)) int64_t scr2(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed) {
    int64_t windows=n-anchor+1, q=windows/2;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    const uint8_t *bits = tb->bits; const uint64_t shift = tb->filter_shift;
    uint64_t h0=window_hash(t,4,0*q,anchor); uint64_t *o0=passed+2*0*q;uint64_t h1=window_hash(t,4,1*q,anchor); uint64_t *o1=passed+2*1*q;
    for (int64_t i=0;;i++){ SCR(o0,0*q+i,h0);SCR(o1,1*q+i,h1); if (i+1==q) break; RL(h0,0*q,i);RL(h1,1*q,i); }
    return (o0-passed-2*0*q)/2+(o1-passed-2*1*q)/2; }


#define CAND(pos, h) do { cand[2*nc] = (uint64_t)(pos); cand[2*nc+1] = (h); nc += pass1(bits, shift, (h) * MIX); } while (0)
__attribute__((noinline)) int64_t scr4c(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed, uint64_t *cand) {
    int64_t windows=n-anchor+1, q=windows/4;
    uint64_t top=1; for (int64_t j=1;j<anchor;j++) top*=BASE;
    uint64_t base_inv=BASE; for(int k=0;k<6;k++) base_inv*=2-BASE*base_inv;
    const uint8_t *bits = tb->bits; const uint64_t shift = tb->filter_shift;
    uint64_t h0=window_hash(t,4,0*q,anchor); uint64_t *o0=passed+2*0*q;uint64_t h1=window_hash(t,4,1*q,anchor); uint64_t *o1=passed+2*1*q;uint64_t h2=window_hash(t,4,2*q,anchor); uint64_t *o2=passed+2*2*q;uint64_t h3=window_hash(t,4,3*q,anchor); uint64_t *o3=passed+2*3*q;
    int64_t nc = 0;
    for (int64_t i=0;;i++){ CAND(0*q+i,h0);CAND(1*q+i,h1);CAND(2*q+i,h2);CAND(3*q+i,h3); if (i+1==q) break; RL(h0,0*q,i);RL(h1,1*q,i);RL(h2,2*q,i);RL(h3,3*q,i); }
    uint64_t *o[4] = {o0,o1,o2,o3};
    for (int64_t c = 0; c < nc; c++) {
        uint64_t pos = cand[2*c], h = cand[2*c+1];
        if (pass2(bits, shift, h * MIX)) { int k = pos / q; o[k][0] = pos; o[k][1] = h; o[k] += 2; }
    }
    return (o[0]-passed)/2 + (o[1]-passed-2*q)/2 + (o[2]-passed-4*q)/2 + (o[3]-passed-6*q)/2; }
__attribute__((noinline)) int64_t screen_cur(const sa_table *tb, const uint32_t *t, int64_t n, int64_t anchor, uint64_t *passed){
    return screen_of(tb,t,4,n,anchor,passed);
}

static const char *path(const char *dir, const char *name) { static char buf[4096]; snprintf(buf, sizeof buf, "%s/%s", dir, name); return buf; }
int main(int argc,char**argv){ if (argc < 2) return 2;
    static uint8_t bits[65536]; static uint32_t miss[8192], hit[8192];
    FILE*f=fopen(path(argv[1],"bits.bin"),"rb");fread(bits,1,65536,f);fclose(f);
    f=fopen(path(argv[1],"miss.bin"),"rb");fread(miss,4,8192,f);fclose(f);
    f=fopen(path(argv[1],"hit.bin"),"rb");fread(hit,4,8192,f);fclose(f);
    sa_table tb={0}; tb.bits=bits; tb.filter_shift=45;
    int64_t n=8192, A=32; static uint64_t passed[2*8192+64]; static uint64_t candbuf[2*8192+64]; static uint64_t pw[8192], invmix[8192], P[8193];
    uint64_t binv=BASE; for(int k=0;k<6;k++) binv*=2-BASE*binv;
    uint64_t p=1,ip=MIX; for(int i=0;i<8192;i++){pw[i]=p;invmix[i]=ip;p*=BASE;ip*=binv;}
    const char* names[]={"cur","8lanes","tables","roll_only","roll_mix","blk","scr4","scr3","scr2","scr4c"};
    for (int which=0; which<2; which++){ const uint32_t*t= which?hit:miss;
    for (int v=0; v<10; v++){
        double best=1e18; uint64_t r=0; unsigned long long bc=~0ULL;
        for(int rep=0;rep<3000;rep++){
            unsigned long long c0=__rdtsc(); double t0=now();
            switch(v){case 0:r=screen_cur(&tb,t,n,A,passed);break;case 1:r=screen8(&tb,t,n,A,passed);break;case 2:r=screen_tab(&tb,t,n,A,passed,pw,invmix,P);break;case 3:r+=roll_only(t,n,A,0);break;case 4:r+=roll_mix(t,n,A,&tb);break;case 5:r=screen_blk(&tb,t,n,A,passed);break;case 6:r=scr4(&tb,t,n,A,passed);break;case 7:r=scr3(&tb,t,n,A,passed);break;case 8:r=scr2(&tb,t,n,A,passed);break;case 9:r=scr4c(&tb,t,n,A,passed,candbuf);break;}
            double dt=now()-t0; unsigned long long dc=__rdtsc()-c0; if(dt<best)best=dt; if(dc<bc)bc=dc;
        }
        printf("%s %-10s %7.2f us  %.2f tsc/window  (r=%llu)\n", which?"hit ":"miss", names[v], best/1e3, (double)bc/(n-A+1), (unsigned long long)((v!=3&&v!=4)?r:0));
    }}
}
