	vpmullq	%zmm13, %zmm0, %zmm6
	kmovb	%k1, %k2
	vmovdqa64	%zmm0, 264(%rsp)
	vpsrlq	%xmm8, %zmm6, %zmm6
	vpsrlq	$6, %zmm6, %zmm10
	vpandq	%zmm12, %zmm6, %zmm6
	vpgatherqq	(%rsi,%zmm10,8), %zmm2{%k2}
	vpsrlvq	%zmm6, %zmm2, %zmm2
	vpandq	%zmm11, %zmm2, %zmm2
	vptestmq	%zmm2, %zmm2, %k0
	kmovb	%k0, %edx
	testl	%edx, %edx
	addq	$1, %r11
	cmpq	%r8, %r11
	vmovdqa64	8(%rsp), %zmm5
	vmovq	%xmm14, %rax
	kmovb	%k1, %k6
	kmovb	%k1, %k7
	addq	%rdi, %rax
	vpgatherqq	(%rdi,%zmm5,8), %zmm6{%k6}
	addq	$8, %rdi
	vpgatherqq	(%rax,%zmm5,8), %zmm2{%k7}
	vpsubq	%zmm6, %zmm0, %zmm0
	vpmullq	%zmm2, %zmm4, %zmm2
	vpmullq	%zmm3, %zmm0, %zmm0
	vpaddq	%zmm2, %zmm0, %zmm0
